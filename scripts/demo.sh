#!/usr/bin/env bash
# The main job: a private containerd (its own root, state and socket), a
# container run through io.vsnap.v1, its output printed. Installs what it
# needs first (scripts/setup.sh, idempotent). Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
[ "$(id -u)" -eq 0 ] || { echo "demo: must run as root" >&2; exit 1; }
./scripts/setup.sh
for d in "${CARGO_HOME:-$HOME/.cargo}/bin" /root/.cargo/bin; do
    [ -d "$d" ] && PATH="$d:$PATH"
done
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

cargo build --release -p vsnap-shim -p vsnap-ref-engine
TOP=$(pwd)
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

mkdir -p "$D/bin" "$D/rootfs/bin" "$D/rootfs/proc" "$D/rootfs/dev" "$D/rootfs/tmp"
ln -s "$TOP/target/release/containerd-shim-vsnap-v1" "$D/bin/"
cp /bin/busybox "$D/rootfs/bin/"
for a in sh echo cat sleep uname; do ln -s busybox "$D/rootfs/bin/$a"; done
cat > "$D/config.toml" <<TOML
version = 3
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]
root = "$D/root"
state = "$D/state"
[grpc]
  address = "$D/state/containerd.sock"
TOML
echo "demo: starting a private containerd in $D"
PATH="$D/bin:/opt/vsnap/containerd/bin:$PATH" /opt/vsnap/containerd/bin/containerd \
    --config "$D/config.toml" >"$D/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done

echo "demo: ctr run --runtime io.vsnap.v1 (a busybox root filesystem)"
"${CTR[@]}" run --rm --runtime io.vsnap.v1 --rootfs "$D/rootfs" demo \
    /bin/sh -c 'echo "hello from a vsnap container on $(uname -r)"; exit 0'
echo "demo: done"
