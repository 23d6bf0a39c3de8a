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

# Prints the config of a private containerd in folder DIR: its own root,
# state and socket; CRI and NRI off, so instances never share a socket.
# An optional second argument sets the debug log level.
vsnap_containerd_config() {
    local dir=$1 level=${2:-}
    cat <<TOML
version = 3
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]
root = "$dir/root"
state = "$dir/state"
[grpc]
  address = "$dir/state/containerd.sock"
TOML
    if [ -n "$level" ]; then
        printf '[debug]\n  level = "%s"\n' "$level"
    fi
}

# Makes DIR a root filesystem for the reference engine: busybox (sh, echo, cat, sleep,
# uname), the engine binary ENGINE at /vsnap-ref-engine and the libraries it links against.
vsnap_engine_rootfs() {
    local dir=$1 engine=$2 a lib
    mkdir -p "$dir/bin" "$dir/proc" "$dir/dev" "$dir/tmp" "$dir/run"
    cp "$(command -v busybox)" "$dir/bin/busybox"
    for a in sh echo cat sleep uname; do ln -sfn busybox "$dir/bin/$a"; done
    cp "$engine" "$dir/vsnap-ref-engine"
    for lib in $(ldd "$engine" | grep -o '/[^ ]*'); do
        mkdir -p "$dir$(dirname "$lib")"
        cp "$lib" "$dir$lib"
    done
}

# Runs a benchmark written as an example of the e2e crate (tests/examples/NAME.rs)
# against release builds of the shim, the reference engine and the CLI. Run as root.
vsnap_bench_example() {
    local name=$1
    [ "$(id -u)" -eq 0 ] || { echo "bench: must run as root" >&2; exit 1; }
    ./scripts/setup.sh >&2
    vsnap_path
    cargo build --release -p vsnap-shim -p vsnap-ref-engine -p vsnap-cli >&2
    VSNAP_SHIM_BIN="$(vsnap_target_dir)/release/containerd-shim-vsnap-v1"
    export VSNAP_SHIM_BIN
    cargo run --release -q -p vsnap-e2e --example "$name"
}
