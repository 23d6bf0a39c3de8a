#!/usr/bin/env bash
# Prepares the README's tour. Run as root from anywhere in the checkout.
#
#   ./scripts/tour-prep.sh           clean up a previous tour, install what is missing
#                                    (scripts/setup.sh), build the binaries the tour uses
#                                    and fill /tmp/vsnap-tour
#   ./scripts/tour-prep.sh --clean   only the cleanup
#
# /tmp/vsnap-tour (VSNAP_TOUR_DIR) then holds rootfs/ (the reference engine, busybox) and
# containerd.toml (a private containerd: its own root, state and socket, CRI and NRI off).
# The cleanup removes what the tour makes: the containers of the tour's containerd, that
# containerd (the pid in containerd.pid), the dockerd of docs/docker.md if one was
# started (the pid in docker/dockerd.pid), the artifact "tour" and the folder itself.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
[ "$(id -u)" -eq 0 ] || { echo "tour-prep: must run as root" >&2; exit 1; }
. scripts/lib.sh
vsnap_path

T=${VSNAP_TOUR_DIR:-/tmp/vsnap-tour}
CTR=(/opt/vsnap/containerd/bin/ctr --address "$T/state/containerd.sock")

# The dockerd of docs/docker.md, if one was started beside the tour: its containers, then
# dockerd by its pid, then what it left mounted under its folders (its network namespace).
clean_docker() {
    local sock=$T/docker/docker.sock pid c m
    if [ -S "$sock" ]; then
        for c in $(/opt/vsnap/docker/bin/docker -H "unix://$sock" ps -aq 2>/dev/null); do
            echo "tour-prep: removing docker container $c"
            /opt/vsnap/docker/bin/docker -H "unix://$sock" rm -f "$c" >/dev/null
        done
    fi
    pid=$(cat "$T/docker/dockerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /opt/vsnap/docker/bin/dockerd ]; then
        echo "tour-prep: stopping the tour's dockerd (pid $pid)"
        kill "$pid"
        for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        [ ! -d "/proc/$pid" ] || { echo "tour-prep: dockerd $pid did not stop" >&2; exit 1; }
    fi
    for m in $(awk -v d="$T/docker/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
        umount "$m"
    done
}

clean() {
    clean_docker
    if [ -S "$T/state/containerd.sock" ] && "${CTR[@]}" version >/dev/null 2>&1; then
        for c in $("${CTR[@]}" c ls -q); do
            echo "tour-prep: removing container $c"
            "${CTR[@]}" task rm -f "$c" >/dev/null 2>&1 || true
            "${CTR[@]}" c rm "$c"
        done
    fi
    local pid
    pid=$(cat "$T/containerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = /opt/vsnap/containerd/bin/containerd ]; then
        echo "tour-prep: stopping the tour's containerd (pid $pid)"
        kill "$pid"
        for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        [ ! -d "/proc/$pid" ] || { echo "tour-prep: containerd $pid did not stop" >&2; exit 1; }
    fi
    # inspect: 0 valid, 1 invalid (both exist), 2 absent.
    if [ -x target/release/vsnap ]; then
        local rc=0
        target/release/vsnap inspect tour >/dev/null 2>&1 || rc=$?
        [ "$rc" -eq 2 ] || target/release/vsnap rm tour
    fi
    # Never remove a folder something is still mounted under.
    if grep -q " $T[/ ]" /proc/self/mounts; then
        echo "tour-prep: something is still mounted under $T; not removing it:" >&2
        grep " $T[/ ]" /proc/self/mounts >&2
        exit 1
    fi
    rm -rf "$T"
}

clean
[ "${1:-}" = --clean ] && { echo "tour-prep: cleaned up"; exit 0; }

./scripts/setup.sh
cargo build --release -p vsnap-shim -p vsnap-oci-hooks -p vsnap-cli -p vsnap-ref-engine
vsnap_criu_cache release
mkdir -p "$T"
vsnap_engine_rootfs "$T/rootfs" target/release/vsnap-ref-engine
vsnap_containerd_config "$T" >"$T/containerd.toml"
echo "tour-prep: ready: $T/rootfs, $T/containerd.toml; binaries in $PWD/target/release"
