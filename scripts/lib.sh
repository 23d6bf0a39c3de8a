# shellcheck shell=bash
# Shared by the project's scripts (sourced, not run).

# Puts cargo and the system folders on PATH (CI's PATH may lack either).
vsnap_path() {
    local d
    for d in "${CARGO_HOME:-$HOME/.cargo}/bin" /root/.cargo/bin; do
        [ -d "$d" ] && PATH="$d:$PATH"
    done
    export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
}

# Prints the absolute path of the folder cargo builds into: CARGO_TARGET_DIR (relative
# to the current folder, as cargo reads it), else ./target. A script that runs cargo
# takes its binaries from here, so that it never runs stale ones from ./target when
# CARGO_TARGET_DIR points elsewhere.
vsnap_target_dir() {
    local t=${CARGO_TARGET_DIR:-target}
    mkdir -p "$t" && (cd "$t" && pwd)
}

# The definitions below are the only ones: the e2e harness (tests/src/lib_sh.rs) runs
# them with bash for its private containerd instances and its root filesystems, so the
# tests, the benchmarks, the demo and the tour all run the same configs and folders.

# Prints the config of a private containerd in folder DIR: its own root, state and
# socket, NRI off. LEVEL (optional, may be empty) sets the debug log level. PLUGINS
# (optional): "cri" keeps the CRI plugins on, their tables appended by the caller (the
# config ends with tables: whatever follows it must be tables too); by default CRI is
# off as well, so instances never share a socket.
vsnap_containerd_config() {
    local dir=$1 level=${2:-} plugins=${3:-} disabled
    case "$plugins" in
        "") disabled='"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"' ;;
        cri) disabled='"io.containerd.nri.v1.nri"' ;;
        *) echo "vsnap_containerd_config: PLUGINS is cri or nothing, not '$plugins'" >&2; return 1 ;;
    esac
    cat <<TOML
version = 3
disabled_plugins = [$disabled]
root = "$dir/root"
state = "$dir/state"
[grpc]
  address = "$dir/state/containerd.sock"
# As docs/kubernetes.md asks of a vsnap node: the dead-shim delete's budget.
[timeouts]
  "io.containerd.timeout.shim.cleanup" = "30s"
TOML
    if [ -n "$level" ]; then
        printf '[debug]\n  level = "%s"\n' "$level"
    fi
}

# The host's static busybox (busybox-static, installed by scripts/setup.sh) and the
# applets linked to it in a root filesystem. A caller may name another busybox for one
# call (VSNAP_BUSYBOX=PATH vsnap_engine_rootfs ...); sourcing this file resets it.
VSNAP_BUSYBOX=/bin/busybox
VSNAP_BUSYBOX_APPLETS=(sh echo cat sleep tty true false ls ps date read kill env id head wc)

# Makes DIR a busybox root filesystem: /bin/busybox, its applets (an entry already
# there is kept) and the folders proc, sys, dev, tmp, etc and out.
vsnap_busybox_rootfs() {
    local dir=$1 d a
    [ -x "$VSNAP_BUSYBOX" ] || { echo "vsnap_busybox_rootfs: $VSNAP_BUSYBOX missing (busybox-static: scripts/setup.sh)" >&2; return 1; }
    for d in bin proc sys dev tmp etc out; do mkdir -p "$dir/$d" || return; done
    cp "$VSNAP_BUSYBOX" "$dir/bin/busybox" || return
    for a in "${VSNAP_BUSYBOX_APPLETS[@]}"; do
        [ -e "$dir/bin/$a" ] || [ -L "$dir/bin/$a" ] || ln -s busybox "$dir/bin/$a" || return
    done
}

# Makes DIR a root filesystem for the reference engine: a busybox one (for exec) with
# the engine binary ENGINE at /vsnap-ref-engine, the libraries it links against (as
# ldd lists them) and the folders run, lib and lib64.
vsnap_engine_rootfs() {
    local dir=$1 engine=$2 libs lib
    vsnap_busybox_rootfs "$dir" || return
    mkdir -p "$dir/run" "$dir/lib" "$dir/lib64" || return
    cp "$engine" "$dir/vsnap-ref-engine" || return
    libs=$(ldd "$engine" 2>/dev/null | grep -o '/[^ ]*') || libs= # none: a static engine
    for lib in $libs; do
        mkdir -p "$dir$(dirname "$lib")" && cp "$lib" "$dir$lib" || return
    done
}

# CRIU's kernel-probe cache kept on a tmpfs where /run is none (`vsnap host
# criu-cache`, docs/operations.md): without it every CRIU run probes the kernel
# again (30-60 ms), as it does on no systemd host. PROFILE: debug or release.
vsnap_criu_cache() {
    "$(vsnap_target_dir)/$1/vsnap" host criu-cache >&2
}

# Runs a benchmark written as an example of the e2e crate (tests/examples/NAME.rs)
# against release builds of the shim, the reference engine and the CLI. Run as root.
vsnap_bench_example() {
    local name=$1
    [ "$(id -u)" -eq 0 ] || { echo "bench: must run as root" >&2; exit 1; }
    ./scripts/setup.sh >&2
    vsnap_path
    # vsnap-hook beside the shim, as installed: without it a restore runs no
    # preflight hooks and would be measured faster than on a real node.
    cargo build --release -p vsnap-shim -p vsnap-ref-engine -p vsnap-cli -p vsnap-oci-hooks >&2
    vsnap_criu_cache release
    VSNAP_SHIM_BIN="$(vsnap_target_dir)/release/containerd-shim-vsnap-v1"
    export VSNAP_SHIM_BIN
    cargo run --release -q -p vsnap-e2e --example "$name"
}

# Stops a private containerd started by this script (pid PID, reached with the
# ctr command line CTR...): its tasks killed and deleted, its containers
# removed, then containerd itself by pid (SIGTERM, SIGKILL after 10 s).
vsnap_stop_containerd() {
    local pid=$1 t c
    shift
    for t in $("$@" task ls -q 2>/dev/null); do "$@" task kill -s SIGKILL "$t" 2>/dev/null; done
    for t in $("$@" task ls -q 2>/dev/null); do
        for _ in $(seq 50); do "$@" task delete "$t" >/dev/null 2>&1 && break; sleep 0.1; done
    done
    for c in $("$@" c ls -q 2>/dev/null); do "$@" c rm "$c" >/dev/null 2>&1; done
    kill "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}
