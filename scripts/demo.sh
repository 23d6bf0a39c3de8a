#!/usr/bin/env bash
# The main job: a private containerd (its own root, state and socket), a
# container run through io.vsnap.v1, its output printed. Installs what it
# needs first (scripts/setup.sh, idempotent). Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
[ "$(id -u)" -eq 0 ] || { echo "demo: must run as root" >&2; exit 1; }
./scripts/setup.sh
. scripts/lib.sh
vsnap_path

cargo build --release -p vsnap-shim -p vsnap-ref-engine -p vsnap-oci-hooks -p vsnap-cli
vsnap_criu_cache release
TARGET=$(vsnap_target_dir)
D=$(mktemp -d /tmp/vsnap-demo.XXXXXX)
CTR=(/opt/vsnap/containerd/bin/ctr --address "$D/state/containerd.sock")
CPID=
cleanup() {
    set +e
    for t in $("${CTR[@]}" task ls -q 2>/dev/null); do "${CTR[@]}" task kill -s SIGKILL "$t"; done
    sleep 0.3
    for t in $("${CTR[@]}" task ls -q 2>/dev/null); do "${CTR[@]}" task delete "$t"; done
    for c in $("${CTR[@]}" c ls -q 2>/dev/null); do "${CTR[@]}" c rm "$c"; done
    [ -n "$CPID" ] && kill "$CPID" && wait "$CPID"
    rm -rf "$D"
}
trap cleanup EXIT

ENGINE="$TARGET/release/vsnap-ref-engine"
INIT_MS=${DEMO_INIT_MS:-4000}
STATE_MB=${DEMO_STATE_MB:-512}
mkdir -p "$D/bin"
ln -s "$TARGET/release/containerd-shim-vsnap-v1" "$D/bin/"
vsnap_engine_rootfs "$D/rootfs" "$ENGINE"
vsnap_containerd_config "$D" >"$D/config.toml"
cat > "$D/vsnap.toml" <<TOML
artifact_root = "$D/artifacts"
TOML
echo "demo: starting a private containerd in $D"
PATH="$D/bin:/opt/vsnap/containerd/bin:$PATH" /opt/vsnap/containerd/bin/containerd \
    --config "$D/config.toml" >"$D/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done

now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }
wait_port() { for _ in $(seq 1200); do curl -s -o /dev/null "http://127.0.0.1:$1/health" && return 0; sleep 0.05; done; return 1; }
# The completion without its per-request id and timestamp.
ask() {
    curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"ref","prompt":"The capital of France is","max_tokens":8,"temperature":0,"logprobs":1,"return_token_ids":true}' |
        sed -E 's/"created":[0-9]+,//; s/"id":"[^"]*",//'
}
run_engine() { # id port [plan]
    # Without a plan the engine listens where its arguments say; with one, where
    # vsnap.io/listen says (argv is part of the artifact's identity: keep it equal).
    local ann=() args=(--host 127.0.0.1 --port "$2")
    [ -n "${3:-}" ] && { ann=(--annotation "vsnap.io/plan=$3" --annotation vsnap.io/artifact=demo
        --annotation "vsnap.io/listen=127.0.0.1:$2"); args=(); }
    "${CTR[@]}" run -d --net-host --runtime io.vsnap.v1 --runtime-config-path "$D/vsnap.toml" \
        "${ann[@]}" --env "VSNAP_ENGINE_INIT_MS=$INIT_MS" --env "VSNAP_ENGINE_STATE_MB=$STATE_MB" \
        --rootfs "$D/rootfs" "$1" /vsnap-ref-engine "${args[@]}" >>"$D/engines.log" 2>&1
}
stop() { "${CTR[@]}" task kill -s SIGKILL "$1"; sleep 0.3; "${CTR[@]}" task delete "$1" >/dev/null 2>&1 || true; "${CTR[@]}" c rm "$1"; }

echo "demo: 1. cold start without a plan (engine init ${INIT_MS} ms of CPU, ${STATE_MB} MiB of state)"
t=$(now); run_engine cold 18080; wait_port 18080; COLD=$(since "$t")
COLD_ANSWER=$(ask 18080); stop cold
echo "demo:    ready in ${COLD} s"

echo "demo: 2. create: cold start privately, capture with runc + CRIU, publish, the donor serves"
t=$(now); run_engine donor 18081 create
for _ in $(seq 2400); do [ -f "$D/artifacts/demo/manifest.json" ] && break; sleep 0.05; done
wait_port 18081; CREATE=$(since "$t")
DONOR_ANSWER=$(ask 18081); stop donor
echo "demo:    artifact published and donor serving in ${CREATE} s ($(du -sh "$D/artifacts/demo" | cut -f1))"

echo "demo: 3. restore, twice from the same artifact (ctr returns once the copy validated its canary and listens)"
for i in 1 2; do
    t=$(now); run_engine "copy$i" "1808$((i+1))" restore; RESTORE=$(since "$t")
    COPY_ANSWER=$(ask "1808$((i+1))")
    echo "demo:    copy$i ready in ${RESTORE} s"
    [ "$COPY_ANSWER" = "$COLD_ANSWER" ] || { echo "demo: copy$i answered differently:"; echo "$COPY_ANSWER"; exit 1; }
    stop "copy$i"
done
[ "$DONOR_ANSWER" = "$COLD_ANSWER" ] || { echo "demo: the donor answered differently"; exit 1; }
echo "demo: a restored engine answers exactly like a cold-started one:"
echo "$COLD_ANSWER"
echo "demo: manifest:"; cat "$D/artifacts/demo/manifest.json"; echo
echo "demo: done"
