#!/usr/bin/env bash
# `scripts/bench.sh snapshot`, or run directly.
#
# Snapshot benchmark: the reference engine with a multi-second init and a large block of
# memory it never releases (so it is IN the CRIU image), cold start vs restore, measured
# side by side in ONE run under ONE private containerd (its own root, state, socket),
# through io.vsnap.v1:
#
#   1. create: cold start + capture + publish; the manifest's timings (capture-ready,
#      inventory, checkpoint) and image size; checkpoint throughput = image bytes /
#      checkpoint time;
#   2. raw read of the artifact's image files (`cat images/* >/dev/null`): cold page
#      cache (sync; echo 3 >/proc/sys/vm/drop_caches) and warm (read twice, the second
#      timed); and the memory pages (pages-*.img) read by dd into one freshly allocated
#      buffer (every page faulted in, as a restore must place them);
#   3. BENCH_RUNS pairs of cold start (no plan; `ctr run -d` until /health answers) and
#      restore (`ctr run -d` with plan=restore: it returns once the copy validated its
#      canary and listens; then /health is confirmed), in ABBA order, each pair with one
#      more restore under `page_placement = "criu"` (CRIU placing the pages itself) beside
#      the default page server; per restore the shim's phase timings (vsnap-restore.json in
#      the bundle: preflight, CRIU restore incl. the page server's fill, activation +
#      canary, listener); restore throughput = image bytes / CRIU restore phase;
#   4. BENCH_COLD_RUNS restores right after dropping the page cache, reported apart;
#   2b. the machine's fresh-memory fill rate (the pages pread into a fresh mapping by 1
#      and 2 threads, 4 KiB pages and MADV_HUGEPAGE: tests/examples/fill_rate.rs);
#   5. a stock `runc restore` of the same images (no hooks, no verification) beside
#      vsnap's CRIU phase;
#   6. 8 restores of the one artifact started at once: time until all are ready and the
#      memory they took.
#   Every answer of a copy to one completion is compared with the cold engine's.
#
# The report (markdown) goes to stdout and, with BENCH_OUT, to that file; progress to
# stderr. Runs scripts/setup.sh first (idempotent). Takes the binaries from
# BENCH_TARGET_DIR/release (default CARGO_TARGET_DIR, else ./target), building them
# only if missing. Cleans up
# everything it started on exit (tasks, containers, containerd by pid, temp dir), also
# on failure. Run as root; drops the page cache (machine-wide) for the cold numbers.
#
# Environment:
#   BENCH_RUNS=5            paired cold start / restore runs (ABBA order)
#   BENCH_COLD_RUNS=3       restores with a cold page cache (each after a drop)
#   BENCH_INIT_MS=3000      VSNAP_ENGINE_INIT_MS: CPU burnt at start-up (compilation)
#   BENCH_RESIDENT_MB=1024  VSNAP_ENGINE_RESIDENT_MB: never released, lands in the image
#   BENCH_STATE_MB=256      VSNAP_ENGINE_STATE_MB: released before capture, reloaded
#   BENCH_TARGET_DIR=DIR    where release/containerd-shim-vsnap-v1 and
#                           release/vsnap-ref-engine are (default CARGO_TARGET_DIR,
#                           else target)
#   BENCH_OUT=FILE          also write the report to FILE
#   BENCH_VERIFY=1          0: verify_contents = false (to see what verification costs)
#   BENCH_LOGS=DIR          keep each restore's vsnap-restore.json and CRIU restore.log there
set -euo pipefail
cd "$(dirname "$0")/../.."
exec </dev/null
export LC_ALL=C
[ "$(id -u)" -eq 0 ] || { echo "bench-snapshot: must run as root" >&2; exit 1; }

RUNS=${BENCH_RUNS:-5}
COLD_RUNS=${BENCH_COLD_RUNS:-3}
INIT_MS=${BENCH_INIT_MS:-3000}
RESIDENT_MB=${BENCH_RESIDENT_MB:-1024}
STATE_MB=${BENCH_STATE_MB:-256}
for v in RUNS COLD_RUNS INIT_MS RESIDENT_MB STATE_MB; do
    case "${!v}" in '' | *[!0-9]*) echo "bench-snapshot: BENCH_$v must be a whole number" >&2; exit 1 ;; esac
done
[ "$RUNS" -ge 1 ] || { echo "bench-snapshot: BENCH_RUNS must be >= 1" >&2; exit 1; }

say() { printf 'bench-snapshot: %s\n' "$*" >&2; }

./scripts/setup.sh >&2
. scripts/lib.sh
vsnap_path

CBIN=/opt/vsnap/containerd/bin
TARGET=$(CARGO_TARGET_DIR=${BENCH_TARGET_DIR:-${CARGO_TARGET_DIR:-target}} vsnap_target_dir)
SHIM="$TARGET/release/containerd-shim-vsnap-v1"
ENGINE="$TARGET/release/vsnap-ref-engine"
if [ ! -x "$SHIM" ] || [ ! -x "$ENGINE" ]; then
    say "building the release binaries into $TARGET"
    CARGO_TARGET_DIR="$TARGET" cargo build --release -p vsnap-shim -p vsnap-ref-engine -p vsnap-oci-hooks >&2
fi
[ -x "$TARGET/release/vsnap" ] || CARGO_TARGET_DIR="$TARGET" cargo build --release -p vsnap-cli >&2
CARGO_TARGET_DIR="$TARGET" vsnap_criu_cache release
for b in "$SHIM" "$ENGINE" /bin/busybox "$CBIN/containerd" "$CBIN/ctr"; do
    [ -x "$b" ] || { echo "bench-snapshot: $b missing" >&2; exit 1; }
done

# --- a private containerd ---------------------------------------------------------------
D=$(mktemp -d /tmp/vsnap-bench-snapshot.XXXXXX)
SOCK="$D/state/containerd.sock"
CTR=("$CBIN/ctr" --address "$SOCK")
CPID=
ENGINE_PID=
cleanup() {
    local rc=$? t c m
    set +e
    trap - EXIT INT TERM
    [ -n "$ENGINE_PID" ] && kill -KILL "$ENGINE_PID" 2>/dev/null && wait "$ENGINE_PID" 2>/dev/null
    if [ -n "$CPID" ] && kill -0 "$CPID" 2>/dev/null; then
        vsnap_stop_containerd "$CPID" "${CTR[@]}"
    fi
    if [ "$rc" -ne 0 ] && [ -f "$D/containerd.log" ]; then
        echo "bench-snapshot: FAILED (exit $rc); last lines of containerd's log:" >&2
        tail -n 30 "$D/containerd.log" >&2
    fi
    # Never let rm -rf walk into a mount left behind (a bundle rootfs, say).
    for m in $(awk -v d="$D/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        umount -l "$m" 2>/dev/null
    done
    rm -rf "$D"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$D/bin"
ln -s "$SHIM" "$D/bin/containerd-shim-vsnap-v1"
vsnap_engine_rootfs "$D/rootfs" "$ENGINE"
vsnap_containerd_config "$D" >"$D/config.toml"
ARTIFACTS="$D/artifacts"
cat >"$D/vsnap.toml" <<TOML
artifact_root = "$ARTIFACTS"
verify_contents = $([ "${BENCH_VERIFY:-1}" = 0 ] && echo false || echo true)
TOML
# The same with CRIU placing the pages itself (one thread), for the side-by-side rows.
{ cat "$D/vsnap.toml"; echo 'page_placement = "criu"'; } >"$D/vsnap-criu.toml"
RCONF="$D/vsnap.toml"
say "starting a private containerd in $D"
PATH="$D/bin:$CBIN:$PATH" "$CBIN/containerd" --config "$D/config.toml" >"$D/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
"${CTR[@]}" version >/dev/null || { echo "bench-snapshot: containerd did not come up" >&2; exit 1; }

# --- helpers ----------------------------------------------------------------------------
NAME=bench
ART="$ARTIFACTS/$NAME"
BUNDLES="$D/state/io.containerd.runtime.v2.task/default"
ENV_ARGS=(--env "VSNAP_ENGINE_INIT_MS=$INIT_MS" --env "VSNAP_ENGINE_STATE_MB=$STATE_MB"
    --env "VSNAP_ENGINE_RESIDENT_MB=$RESIDENT_MB")
PORT=18300
N=0

us_since() { local t=$EPOCHREALTIME; echo $((${t/./} - ${1/./})); }
ms() { awk -v u="$1" 'BEGIN { printf "%.0f", u / 1000 }'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
health() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$1/health"; }
# Polls /health every 10 ms for up to 120 s.
wait_health() {
    local i
    for i in $(seq 12000); do health "$1" && return 0; sleep 0.01; done
    echo "bench-snapshot: nothing answers on 127.0.0.1:$1/health" >&2
    return 1
}
# One greedy completion without its per-request id and timestamp.
ask() {
    curl -sf --max-time 10 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"ref","prompt":"The capital of France is","max_tokens":8,"temperature":0,"logprobs":1,"return_token_ids":true}' |
        sed -E 's/"created":[0-9]+,//; s/"id":"[^"]*",//'
}
# ctr run -d of the engine. plan: "" (cold start: listens where argv says), create,
# restore (listens where vsnap.io/listen says; argv and env stay equal to create's:
# they are part of the artifact's workload identity).
run_engine() { # id port plan
    local ann=() args=(--host 127.0.0.1 --port "$2")
    if [ -n "$3" ]; then
        ann=(--annotation "vsnap.io/plan=$3" --annotation "vsnap.io/artifact=$NAME"
            --annotation "vsnap.io/listen=127.0.0.1:$2")
        args=()
    fi
    if ! "${CTR[@]}" run -d --net-host --runtime io.vsnap.v1 --runtime-config-path "$RCONF" \
        "${ann[@]}" "${ENV_ARGS[@]}" --rootfs "$D/rootfs" "$1" /vsnap-ref-engine "${args[@]}" \
        >"$D/run.out" 2>&1; then
        echo "bench-snapshot: ctr run ($1, plan '${3:-none}') failed:" >&2
        cat "$D/run.out" >&2
        exit 1
    fi
}
stop() {
    "${CTR[@]}" task kill -s SIGKILL "$1" >/dev/null 2>&1 || true
    for _ in $(seq 100); do "${CTR[@]}" task delete "$1" >/dev/null 2>&1 && break; sleep 0.05; done
    "${CTR[@]}" c rm "$1" >/dev/null
}
json_num() { # file key [decimals] -> the number (rounded when decimals are given)
    local v
    v=$(sed -nE "s/.*\"$2\":[[:space:]]*([0-9.eE+-]+).*/\1/p" "$1" | head -n 1)
    [ -n "$v" ] || { echo "bench-snapshot: no \"$2\" in $1" >&2; exit 1; }
    if [ -n "${3:-}" ]; then awk -v v="$v" -v p="$3" 'BEGIN { printf "%.*f", p, v }'; else echo "$v"; fi
}
# Quantile q (linear interpolation) of the numbers on stdin, printed with $2 decimals.
quantile() {
    sort -g | awk -v q="$1" -v p="${2:-0}" '{ v[NR] = $1 } END {
        if (NR == 0) { print "n/a"; exit }
        r = (NR - 1) * q; lo = int(r); f = r - lo;
        x = v[lo + 1]; if (lo + 2 <= NR) x += f * (v[lo + 2] - v[lo + 1]);
        printf "%.*f", p, x }'
}
med() { printf '%s\n' "$@" | quantile 0.5 "${DEC:-0}"; }
minmax() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { a = $1 } { b = $1 } END { printf "%s-%s", a, b }'; }
gbps() { awk -v b="$1" -v m="$2" 'BEGIN { if (m > 0) printf "%.2f", b / (m / 1000) / 1e9; else print "n/a" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

# --- 0. the resident data's verification cost, on the host ------------------------------
# The engine in startup mode outside any container, until capture-ready.json: its
# rehearsal recomputes the resident checksum once and logs how long that took (the same
# work its recovery after every restore does, inside activation).
say "0. resident checksum cost: the engine on the host up to capture-ready"
mkdir -m 0700 "$D/hostctl"
VSNAP_ENGINE_INIT_MS=0 VSNAP_ENGINE_STATE_MB=0 VSNAP_ENGINE_RESIDENT_MB="$RESIDENT_MB" \
    VSNAP_SNAPSHOT_CONFIG="{\"mode\":\"startup\",\"control_dir\":\"$D/hostctl\",\"timeout_s\":60}" \
    "$ENGINE" >"$D/hostengine.log" 2>&1 &
ENGINE_PID=$!
for _ in $(seq 1200); do [ -f "$D/hostctl/capture-ready.json" ] && break; sleep 0.05; done
kill -KILL "$ENGINE_PID" 2>/dev/null
wait "$ENGINE_PID" 2>/dev/null || true
ENGINE_PID=
VERIFY_MS=$(sed -nE 's/.*resident data verified \([0-9]+ MiB\) in ([0-9]+) ms.*/\1/p' "$D/hostengine.log" | head -n 1)
VERIFY_MS=${VERIFY_MS:-n/a}

# --- 1. create ---------------------------------------------------------------------------
say "1. create: cold start, capture, publish (init ${INIT_MS} ms, resident ${RESIDENT_MB} MiB, state ${STATE_MB} MiB)"
t0=$EPOCHREALTIME
run_engine donor "$PORT" create
for _ in $(seq 6000); do [ -f "$ART/manifest.json" ] && break; sleep 0.02; done
[ -f "$ART/manifest.json" ] || { echo "bench-snapshot: no artifact published" >&2; exit 1; }
wait_health "$PORT"
CREATE_US=$(us_since "$t0")
stop donor
M="$ART/manifest.json"
IMAGE_BYTES=$(json_num "$M" image_bytes)
CAP_READY_MS=$(json_num "$M" cold_start_to_capture_ready)
INVENTORY_MS=$(json_num "$M" inventory)
CHECKPOINT_MS=$(json_num "$M" checkpoint)
IMAGE_FILES=$(find "$ART/images" -type f | wc -l)
IMAGE_DU=$(du -sb "$ART/images" | cut -f1)
PAGES_BYTES=$(find "$ART/images" -type f -name 'pages-*.img' -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
say "   artifact: $(mib "$IMAGE_BYTES") MiB in $IMAGE_FILES files; checkpoint ${CHECKPOINT_MS} ms"
sync

# --- 2. raw read of the image files --------------------------------------------------------
raw_read() { # -> microseconds of cat images/* >/dev/null
    local t=$EPOCHREALTIME
    cat "$ART"/images/* >/dev/null
    us_since "$t"
}
# The memory pages (pages-*.img, nearly all the bytes) read into freshly allocated memory,
# as a restore must place them: dd with one buffer as large as the largest of them, so
# every page of it is faulted in (allocated and zeroed by the kernel) as it is read into.
BS_MIB=$(find "$ART/images" -type f -name 'pages-*.img' -printf '%s\n' | sort -n | tail -n 1 |
    awk '{ printf "%d", $1 / 1048576 + 1 }')
fresh_read() { # -> microseconds
    local t=$EPOCHREALTIME f
    for f in "$ART"/images/pages-*.img; do dd if="$f" of=/dev/null bs="${BS_MIB}M" iflag=fullblock status=none; done
    us_since "$t"
}
say "2. raw read of the image files: cold page cache, then warm (cat; dd into a fresh ${BS_MIB} MiB buffer)"
RAW_COLD_MS=()
RAW_WARM_MS=()
FRESH_COLD_MS=()
FRESH_WARM_MS=()
for _ in $(seq "$COLD_RUNS"); do
    drop_caches
    RAW_COLD_MS+=("$(ms "$(raw_read)")")
    drop_caches
    FRESH_COLD_MS+=("$(ms "$(fresh_read)")")
done
for _ in 1 2 3; do
    raw_read >/dev/null # the first read fills the cache, the second is timed
    RAW_WARM_MS+=("$(ms "$(raw_read)")")
    FRESH_WARM_MS+=("$(ms "$(fresh_read)")")
done

# --- 2b. the machine's fresh-memory fill rate ---------------------------------------------
# The same pages-*.img bytes pread into one fresh anonymous mapping by 1 and 2 threads, in
# 4 KiB pages and with MADV_HUGEPAGE (THP): the limit a restore that places pages can
# reach here (CRIU 4.2 places them with one thread in 4 KiB pages). Warm page cache.
say "2b. fresh-memory fill rate (1/2 threads, 4 KiB / huge pages), warm page cache"
FILL="$TARGET/release/examples/fill_rate"
if [ ! -x "$FILL" ]; then
    CARGO_TARGET_DIR="$TARGET" cargo build --release -q -p vsnap-e2e --example fill_rate >&2
fi
declare -A FILL_MS=()
cat "$ART"/images/pages-*.img >/dev/null
for _ in 1 2 3; do
    for mode in "1" "2" "--huge 1" "--huge 2"; do
        # shellcheck disable=SC2086
        FILL_MS[$mode]+="$("$FILL" $mode "$ART"/images/pages-*.img | awk '{ printf "%.0f", $4 }') "
    done
done

# --- 3. paired cold start / restore ------------------------------------------------------
COLD_US=()
REST_CTR_US=()
REST_US=()
COLD_ANSWER=
check_answer() { # port who
    local a
    a=$(ask "$1")
    [ -n "$a" ] || { echo "bench-snapshot: $2 gave no answer" >&2; exit 1; }
    if [ -z "$COLD_ANSWER" ]; then
        COLD_ANSWER=$a
    elif [ "$a" != "$COLD_ANSWER" ]; then
        printf 'bench-snapshot: %s answered differently:\n%s\nvs the first:\n%s\n' "$2" "$a" "$COLD_ANSWER" >&2
        exit 1
    fi
}
cold_once() {
    local id port t0
    N=$((N + 1)); id="cold-$N"; port=$((PORT + N))
    t0=$EPOCHREALTIME
    run_engine "$id" "$port" ""
    wait_health "$port"
    COLD_US+=("$(us_since "$t0")")
    check_answer "$port" "$id"
    stop "$id"
}
# One restore; appends to the arrays named by $1 (REST or CREST).
restore_once() {
    local into=$1 id port t0 ctr_us ready_us f pre criu act lis fill
    N=$((N + 1)); id="copy-$N"; port=$((PORT + N))
    t0=$EPOCHREALTIME
    run_engine "$id" "$port" restore
    ctr_us=$(us_since "$t0")
    health "$port" || { echo "bench-snapshot: $id: ctr returned but /health does not answer" >&2; exit 1; }
    ready_us=$(us_since "$t0")
    f="$BUNDLES/$id/vsnap-restore.json"
    [ -f "$f" ] || { echo "bench-snapshot: $id: no $f" >&2; exit 1; }
    cp "$f" "$D/restore-$id.json"
    # BENCH_LOGS=DIR keeps each restore's phases and CRIU log for a closer look.
    if [ -n "${BENCH_LOGS:-}" ]; then
        mkdir -p "$BENCH_LOGS"
        cp "$f" "$BENCH_LOGS/$id.json"
        cp "$BUNDLES/$id/criu-work/restore.log" "$BENCH_LOGS/$id.restore.log" 2>/dev/null || true
    fi
    pre=$(json_num "$f" preflight_ms 1)
    criu=$(json_num "$f" criu_restore_ms 1)
    act=$(json_num "$f" activation_ms 1)
    lis=$(json_num "$f" listener_ms 1)
    fill=$(sed -nE 's/.*"page_fill_ms":[[:space:]]*([0-9.eE+-]+).*/\1/p' "$f" | head -n 1)
    local -n a_ctr="${into}_CTR_US" a_us="${into}_US" a_pre="${into}_PRE" a_criu="${into}_CRIU" \
        a_act="${into}_ACT" a_lis="${into}_LIS" a_fill="${into}_FILL"
    a_ctr+=("$ctr_us"); a_us+=("$ready_us"); a_pre+=("$pre"); a_criu+=("$criu")
    a_act+=("$act"); a_lis+=("$lis"); a_fill+=("$(awk -v v="${fill:-0}" 'BEGIN { printf "%.1f", v }')")
    check_answer "$port" "$id"
    stop "$id"
}
REST_PRE=()
REST_CRIU=()
REST_ACT=()
REST_LIS=()
REST_FILL=()
# Restores with page_placement = "criu" (CRIU's own one-thread placement), one per pair.
SREST_CTR_US=()
SREST_US=()
SREST_PRE=()
SREST_CRIU=()
SREST_ACT=()
SREST_LIS=()
SREST_FILL=()
restore_criu_placed() { RCONF="$D/vsnap-criu.toml"; restore_once SREST; RCONF="$D/vsnap.toml"; }
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
say "3. $RUNS pairs of cold start / restore (ABBA order), each with a restore placed by CRIU alone"
for i in $(seq "$RUNS"); do
    if [ $((i % 2)) -eq 1 ]; then
        cold_once
        restore_once REST
        restore_criu_placed
    else
        restore_criu_placed
        restore_once REST
        cold_once
    fi
    say "   pair $i: cold $(ms "${COLD_US[-1]}") ms, restore $(ms "${REST_US[-1]}") ms (CRIU phase ${REST_CRIU[-1]} ms, page fill ${REST_FILL[-1]} ms); CRIU-placed restore $(ms "${SREST_US[-1]}") ms (CRIU ${SREST_CRIU[-1]} ms)"
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- 4. restores with a cold page cache ----------------------------------------------------
CREST_CTR_US=()
CREST_US=()
CREST_PRE=()
CREST_CRIU=()
CREST_ACT=()
CREST_LIS=()
CREST_FILL=()
say "4. $COLD_RUNS restore(s) right after dropping the page cache"
for _ in $(seq "$COLD_RUNS"); do
    drop_caches
    restore_once CREST
    say "   cold-cache restore $(ms "${CREST_US[-1]}") ms (CRIU ${CREST_CRIU[-1]} ms)"
done

# --- 5. a stock runc restore of the same artifact -------------------------------------------
# runc + CRIU alone, as containerd's runc shim would run them: the bundle of a vsnap copy
# (its spec, without vsnap's hooks and CRIU config), a fresh control dir with the
# artifact's control files, the same CRIU options. Wall time of `runc restore --detach`,
# next to vsnap's CRIU phase (runc restore + its hooks + the verification beside it).
say "5. stock runc restore of the same images (x6: runc's defaults / vsnap's CRIU config, alternating), warm page cache"
STOCK_MS=()
STOCK_CONF_MS=()
STOCK_ROOT="$D/stock-runc"
mkdir -p "$STOCK_ROOT"
run_engine stock-src "$((PORT + 90))" restore
cp "$BUNDLES/stock-src/config.json" "$D/stock-config.json"
# Without lazy-pages: a stock runc restore has no page server to hand the pages to.
grep -vx 'lazy-pages' "$BUNDLES/stock-src/vsnap-criu.conf" >"$D/stock-criu.conf"
# runc's defaults but the one line the images cannot restore without: runc's masked
# folders are external mounts in them (external_masks), bound from the host's empty
# read-only tmpfs (a stock runc restore otherwise stops in CRIU: "mnt: No mapping for ...").
grep -E '^external mnt\[vsnap-empty\]:' "$D/stock-criu.conf" >"$D/stock-min-criu.conf" || true
# vsnap's createRuntime hooks, which runc runs inside `runc restore`: each run by hand
# (3 x) against the live copy's bundle, as runc runs it (the OCI state on stdin).
HOOK_ROWS=()
while IFS=$'\t' read -r name argv; do
    hook_ms=()
    for _ in 1 2 3; do
        t0=$EPOCHREALTIME
        # shellcheck disable=SC2086
        printf '{"ociVersion":"1.0.2","id":"stock-src","status":"creating","pid":1,"bundle":"%s"}' "$BUNDLES/stock-src" |
            $argv >/dev/null 2>"$D/hook.err" || { echo "bench-snapshot: hook $name failed: $(cat "$D/hook.err")" >&2; exit 1; }
        hook_ms+=("$(ms "$(us_since "$t0")")")
    done
    HOOK_ROWS+=("| \`vsnap-hook $name\` | $(med "${hook_ms[@]}") | $(minmax "${hook_ms[@]}") |")
    say "   hook $name: ${hook_ms[*]} ms"
done < <(python3 -c '
import json, sys
spec = json.load(open(sys.argv[1]))
for h in spec.get("hooks", {}).get("createRuntime", []):
    print(h["args"][1] + "\t" + " ".join([h["path"]] + h["args"][1:]))
' "$D/stock-config.json")
stop stock-src
for k in 1 2 3 4 5 6; do
    B="$D/stock-bundle-$k"
    rm -rf "$B" "$D/stock-ctl-$k" "$D/stock-work-$k"
    mkdir -p "$B" "$D/stock-work-$k"
    mkdir -m 0700 "$D/stock-ctl-$k"
    cp "$ART"/control/* "$D/stock-ctl-$k/"
    # Odd runs: runc's defaults (and the masks' mapping); even runs: with vsnap's CRIU
    # config (ghost-limit, libdir, leave-stopped), to see what that config costs on its own.
    python3 - "$D/stock-config.json" "$B/config.json" "$D/rootfs" "$D/stock-ctl-$k" "$k" "$D/stock-criu.conf" "$D/stock-min-criu.conf" <<'PY'
import json, sys
src, dst, rootfs, ctl, k, conf, minimal = sys.argv[1:]
spec = json.load(open(src))
spec["root"]["path"] = rootfs
spec.setdefault("annotations", {})["org.criu.config"] = conf if int(k) % 2 == 0 else minimal
spec.pop("hooks", None)
for m in spec.get("mounts", []):
    if m.get("destination") == "/run/vsnap/control":
        m["source"] = ctl
spec.setdefault("linux", {})["cgroupsPath"] = "/vsnap-bench-stock-" + k
json.dump(spec, open(dst, "w"))
PY
    t0=$EPOCHREALTIME
    runc --root "$STOCK_ROOT" restore --detach --bundle "$B" --image-path "$ART/images" \
        --work-path "$D/stock-work-$k" --tcp-established --ext-unix-sk --file-locks "stock-$k" \
        </dev/null >"$D/stock-$k.out" 2>&1 || { cat "$D/stock-$k.out" >&2; exit 1; }
    if [ $((k % 2)) -eq 1 ]; then
        STOCK_MS+=("$(ms "$(us_since "$t0")")")
    else
        STOCK_CONF_MS+=("$(ms "$(us_since "$t0")")")
    fi
    runc --root "$STOCK_ROOT" kill "stock-$k" KILL >/dev/null 2>&1 || true
    for _ in $(seq 100); do runc --root "$STOCK_ROOT" delete -f "stock-$k" >/dev/null 2>&1 && break; sleep 0.05; done
    say "   stock runc restore $k: $(ms "$(us_since "$t0")") ms (with the kill and delete)"
done

# --- 6. eight restores of one artifact at once ----------------------------------------------
say "6. 8 concurrent restores of the artifact"
# In bytes; awk prints kB (mawk's printf %d stops at 2^31), bash multiplies in 64 bits.
mem_avail() { echo $(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) * 1024)); }
AVAIL_BEFORE=$(mem_avail)
t0=$EPOCHREALTIME
PIDS=()
for k in $(seq 8); do
    ( run_engine "par-$k" "$((PORT + 100 + k))" restore ) &
    PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || { echo "bench-snapshot: a concurrent restore failed" >&2; exit 1; }; done
PAR_MS=$(ms "$(us_since "$t0")")
PAR_USED=$((AVAIL_BEFORE - $(mem_avail)))
for k in $(seq 8); do check_answer "$((PORT + 100 + k))" "par-$k"; done
for k in $(seq 8); do stop "par-$k"; done
say "   8 copies validated and listening in $PAR_MS ms, using $(mib "$PAR_USED") MiB"

# --- report --------------------------------------------------------------------------------
to_ms() { local u; for u in "$@"; do ms "$u"; echo; done; }
mapfile -t COLD_MS < <(to_ms "${COLD_US[@]}")
mapfile -t REST_MS < <(to_ms "${REST_US[@]}")
mapfile -t REST_CTR_MS < <(to_ms "${REST_CTR_US[@]}")
mapfile -t SREST_MS < <(to_ms "${SREST_US[@]}")
SCRIU_MED=$(DEC=1 med "${SREST_CRIU[@]}")
PAIR_RATIOS=()
for i in "${!COLD_MS[@]}"; do PAIR_RATIOS+=("$(ratio "${REST_MS[$i]}" "${COLD_MS[$i]}")"); done
COLD_MED=$(med "${COLD_MS[@]}")
REST_MED=$(med "${REST_MS[@]}")
CRIU_MED=$(DEC=1 med "${REST_CRIU[@]}")
RAW_COLD_MED=$(med "${RAW_COLD_MS[@]}")
RAW_WARM_MED=$(med "${RAW_WARM_MS[@]}")
phase_row() { # label values...
    local label=$1; shift
    printf '| %s | %s | %s |\n' "$label" "$(DEC=1 med "$@")" "$(minmax "$@")"
}
other() { # ctr-wall-ms pre criu act lis -> ms outside the four phases
    awk -v a="$1" -v b="$2" -v c="$3" -v d="$4" -v e="$5" 'BEGIN { printf "%.1f", a - b - c - d - e }'
}
REST_OTHER=()
for i in "${!REST_CTR_MS[@]}"; do
    REST_OTHER+=("$(other "${REST_CTR_MS[$i]}" "${REST_PRE[$i]}" "${REST_CRIU[$i]}" "${REST_ACT[$i]}" "${REST_LIS[$i]}")")
done
mapfile -t CREST_MS < <(to_ms "${CREST_US[@]}")
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- shim engine artifact config protocol 2>/dev/null || git_rev="$git_rev + uncommitted edits"
{
    echo "## vsnap snapshot benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Machine: $(nproc) CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), kernel $(uname -r),"
    echo "memory $(awk '/^MemTotal/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo) GiB total, $(awk '/^MemAvailable/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo) GiB available at the end;"
    echo "artifact root on $(df --output=source,fstype "$ARTIFACTS" | tail -n 1 | tr -s ' ' | sed 's/ / (/; s/$/)/');"
    echo "$("$CBIN/containerd" --version | sed 's/ *$//'), $(runc --version | head -n 1), criu $(criu --version | sed -n 's/^Version: //p' | head -n 1)."
    echo "Binaries: $TARGET/release (git $git_rev). Load average before / after the paired runs: $LOAD_BEFORE / $LOAD_AFTER."
    echo
    echo "Parameters: BENCH_RUNS=$RUNS BENCH_COLD_RUNS=$COLD_RUNS BENCH_INIT_MS=$INIT_MS BENCH_RESIDENT_MB=$RESIDENT_MB BENCH_STATE_MB=$STATE_MB BENCH_VERIFY=${BENCH_VERIFY:-1}"
    echo "(engine env: VSNAP_ENGINE_INIT_MS=$INIT_MS VSNAP_ENGINE_RESIDENT_MB=$RESIDENT_MB VSNAP_ENGINE_STATE_MB=$STATE_MB)."
    echo "GB = 10^9 bytes, MiB = 2^20 bytes."
    echo
    echo "### Cold start vs restore, to ready ($RUNS pairs, ABBA order, warm page cache)"
    echo
    echo "| start | median (ms) | min-max (ms) |"
    echo "|---|---:|---:|"
    echo "| cold start, no plan (\`ctr run -d\` until /health answers) | $COLD_MED | $(minmax "${COLD_MS[@]}") |"
    echo "| restore (\`ctr run -d\` returns, /health confirmed) | $REST_MED | $(minmax "${REST_MS[@]}") |"
    echo "| restore, \`ctr run -d\` alone | $(med "${REST_CTR_MS[@]}") | $(minmax "${REST_CTR_MS[@]}") |"
    echo
    echo "Restore / cold start: **$(ratio "$REST_MED" "$COLD_MED")** (ratio of medians; median of the per-pair ratios $(DEC=3 med "${PAIR_RATIOS[@]}"))."
    echo "Every copy answered one completion exactly like the first cold-started engine."
    echo
    echo "### Restore broken down by phase (shim's vsnap-restore.json, $RUNS warm-cache restores)"
    echo
    echo "| phase | median (ms) | min-max (ms) |"
    echo "|---|---:|---:|"
    phase_row "preflight (artifact validation, at create)" "${REST_PRE[@]}"
    phase_row "CRIU restore (\`runc restore --detach\`, then vsnap's page server placing the memory)" "${REST_CRIU[@]}"
    phase_row "of which: page server fill (after CRIU's restore finished, $(nproc) threads)" "${REST_FILL[@]}"
    phase_row "activation + canary (handshake, engine reload + resident checksum + canary)" "${REST_ACT[@]}"
    phase_row "listener probe" "${REST_LIS[@]}"
    phase_row "rest of \`ctr run -d\` (ctr, containerd, shim start, bookkeeping)" "${REST_OTHER[@]}"
    echo
    echo "Resident checksum alone ($RESIDENT_MB MiB, engine on the host, measured in its rehearsal): $VERIFY_MS ms."
    echo
    echo "### Create (checkpoint) and artifact"
    echo
    echo "| quantity | value |"
    echo "|---|---:|"
    echo "| \`ctr run -d\` until artifact published and donor listening | $(ms "$CREATE_US") ms |"
    echo "| manifest: cold start to capture-ready | $CAP_READY_MS ms |"
    echo "| manifest: inventory | $INVENTORY_MS ms |"
    echo "| manifest: checkpoint (\`runc checkpoint\`, CRIU dump) | $CHECKPOINT_MS ms |"
    echo "| image_bytes (manifest) | $IMAGE_BYTES ($(mib "$IMAGE_BYTES") MiB, $IMAGE_FILES files; pages-*.img $(mib "$PAGES_BYTES") MiB; du $(mib "$IMAGE_DU") MiB) |"
    echo "| checkpoint throughput (image_bytes / checkpoint) | $(gbps "$IMAGE_BYTES" "$CHECKPOINT_MS") GB/s |"
    echo
    echo "### Restore throughput vs raw read of the same image files"
    echo
    echo "| read of the $(mib "$IMAGE_BYTES") MiB of images | median (ms) | min-max (ms) | GB/s (median) |"
    echo "|---|---:|---:|---:|"
    echo "| \`cat images/* >/dev/null\`, warm page cache (3 x, 2nd read of each pair) | $RAW_WARM_MED | $(minmax "${RAW_WARM_MS[@]}") | $(gbps "$IMAGE_BYTES" "$RAW_WARM_MED") |"
    echo "| \`cat images/* >/dev/null\`, cold page cache ($COLD_RUNS x, after drop_caches) | $RAW_COLD_MED | $(minmax "${RAW_COLD_MS[@]}") | $(gbps "$IMAGE_BYTES" "$RAW_COLD_MED") |"
    echo "| \`dd bs=${BS_MIB}M\` of pages-*.img ($(mib "$PAGES_BYTES") MiB) into freshly faulted memory, warm page cache (3 x) | $(med "${FRESH_WARM_MS[@]}") | $(minmax "${FRESH_WARM_MS[@]}") | $(gbps "$PAGES_BYTES" "$(med "${FRESH_WARM_MS[@]}")") |"
    echo "| \`dd bs=${BS_MIB}M\` of pages-*.img into freshly faulted memory, cold page cache ($COLD_RUNS x) | $(med "${FRESH_COLD_MS[@]}") | $(minmax "${FRESH_COLD_MS[@]}") | $(gbps "$PAGES_BYTES" "$(med "${FRESH_COLD_MS[@]}")") |"
    echo "| vsnap restore phase (CRIU lazy-pages + vsnap page server), warm page cache ($RUNS restores) | $CRIU_MED | $(minmax "${REST_CRIU[@]}") | $(gbps "$IMAGE_BYTES" "$CRIU_MED") |"
    echo "| same phase with \`page_placement = \"criu\"\` (CRIU places the pages, one thread), warm ($RUNS restores) | $SCRIU_MED | $(minmax "${SREST_CRIU[@]}") | $(gbps "$IMAGE_BYTES" "$SCRIU_MED") |"
    echo "| CRIU restore, cold page cache ($COLD_RUNS restores) | $(DEC=1 med "${CREST_CRIU[@]}") | $(minmax "${CREST_CRIU[@]}") | $(gbps "$IMAGE_BYTES" "$(DEC=1 med "${CREST_CRIU[@]}")") |"
    echo
    echo "CRIU restore / \`cat\`: warm $(ratio "$CRIU_MED" "$RAW_WARM_MED"), cold $(ratio "$(DEC=1 med "${CREST_CRIU[@]}")" "$RAW_COLD_MED")."
    echo "CRIU restore / \`dd\` into fresh memory: warm $(ratio "$CRIU_MED" "$(med "${FRESH_WARM_MS[@]}")"), cold $(ratio "$(DEC=1 med "${CREST_CRIU[@]}")" "$(med "${FRESH_COLD_MS[@]}")")."
    echo "Transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo n/a)."
    echo
    echo "### The fresh-memory fill rate of this machine (pages-*.img, $(mib "$PAGES_BYTES") MiB, warm page cache, 3 x each)"
    echo
    echo "| placing the pages with | median (ms) | min-max (ms) | GB/s (median) |"
    echo "|---|---:|---:|---:|"
    for mode in "1" "2" "--huge 1" "--huge 2"; do
        # shellcheck disable=SC2086
        set -- ${FILL_MS[$mode]}
        label="${mode#--huge } thread(s), $([ "${mode#--huge}" = "$mode" ] && echo "4 KiB pages" || echo "MADV_HUGEPAGE")"
        echo "| $label | $(med "$@") | $(minmax "$@") | $(gbps "$PAGES_BYTES" "$(med "$@")") |"
    done
    echo
    echo "### vsnap's restore vs a stock \`runc restore\` of the same images (warm page cache)"
    echo
    echo "| restore | median (ms) | min-max (ms) | GB/s (median) |"
    echo "|---|---:|---:|---:|"
    echo "| stock \`runc restore --detach\` (no hooks, no verification), 3 x | $(med "${STOCK_MS[@]}") | $(minmax "${STOCK_MS[@]}") | $(gbps "$IMAGE_BYTES" "$(med "${STOCK_MS[@]}")") |"
    echo "| stock \`runc restore --detach\` with vsnap's CRIU config (ghost-limit, libdir, leave-stopped; not lazy-pages), 3 x | $(med "${STOCK_CONF_MS[@]}") | $(minmax "${STOCK_CONF_MS[@]}") | $(gbps "$IMAGE_BYTES" "$(med "${STOCK_CONF_MS[@]}")") |"
    echo "| vsnap's CRIU phase (runc restore + hooks + verification; page server placing and hashing the pages), $RUNS x | $CRIU_MED | $(minmax "${REST_CRIU[@]}") | $(gbps "$IMAGE_BYTES" "$CRIU_MED") |"
    echo "| vsnap's CRIU phase with \`page_placement = \"criu\"\`, $RUNS x | $SCRIU_MED | $(minmax "${SREST_CRIU[@]}") | $(gbps "$IMAGE_BYTES" "$SCRIU_MED") |"
    echo
    echo "vsnap CRIU phase / stock runc restore: $(ratio "$CRIU_MED" "$(med "${STOCK_MS[@]}")") (page server); $(ratio "$SCRIU_MED" "$(med "${STOCK_MS[@]}")") (CRIU's own placement)."
    echo "Restore to ready with CRIU's own placement: median $(med "${SREST_MS[@]}") ms vs $REST_MED ms with the page server (same run, interleaved)."
    echo
    echo "vsnap's createRuntime hooks (runc runs them inside its restore), each run by hand 3 x against a live copy's bundle:"
    echo
    echo "| hook | median (ms) | min-max (ms) |"
    echo "|---|---:|---:|"
    printf '%s\n' "${HOOK_ROWS[@]}"
    echo
    echo "### 8 restores of one artifact at once"
    echo
    echo "All 8 \`ctr run -d\` (plan=restore) started together: every copy validated and listening after $PAR_MS ms"
    echo "(one restore alone: $REST_MED ms to ready). Memory they took (MemAvailable before - after):"
    echo "$(mib "$PAR_USED") MiB for 8 copies of a $(mib "$IMAGE_BYTES") MiB image ($(awk -v u="$PAR_USED" -v i="$IMAGE_BYTES" 'BEGIN { printf "%.2f", u / (8 * i) }') x 8 images): each copy owns its memory."
    echo
    echo "### Restore with a cold page cache ($COLD_RUNS restores, each right after sync + drop_caches)"
    echo
    echo "| phase | median (ms) | min-max (ms) |"
    echo "|---|---:|---:|"
    echo "| restore to ready (\`ctr run -d\` + /health) | $(med "${CREST_MS[@]}") | $(minmax "${CREST_MS[@]}") |"
    phase_row "preflight" "${CREST_PRE[@]}"
    phase_row "CRIU restore" "${CREST_CRIU[@]}"
    phase_row "activation + canary" "${CREST_ACT[@]}"
    phase_row "listener probe" "${CREST_LIS[@]}"
    echo
    echo "Cold-cache restore / warm-cache cold start: $(ratio "$(med "${CREST_MS[@]}")" "$COLD_MED")."
    echo
    echo "Raw values (ms): cold start ${COLD_MS[*]}; restore ${REST_MS[*]}; CRIU ${REST_CRIU[*]} (fill ${REST_FILL[*]});"
    echo "CRIU-placed restore ${SREST_MS[*]} (CRIU ${SREST_CRIU[*]});"
    echo "activation ${REST_ACT[*]}; cold-cache restore ${CREST_MS[*]} (CRIU ${CREST_CRIU[*]});"
    echo "cat warm ${RAW_WARM_MS[*]}, cold ${RAW_COLD_MS[*]}; dd warm ${FRESH_WARM_MS[*]}, cold ${FRESH_COLD_MS[*]}."
} >"$D/report.md"
cat "$D/report.md"
if [ -n "${BENCH_OUT:-}" ]; then
    cp "$D/report.md" "$BENCH_OUT"
    say "report written to $BENCH_OUT"
fi
say "done"
