# Shared by the project's scripts (sourced, not run).

# Puts cargo and the system folders on PATH (CI's PATH may lack either).
vsnap_path() {
    local d
    for d in "${CARGO_HOME:-$HOME/.cargo}/bin" /root/.cargo/bin; do
        [ -d "$d" ] && PATH="$d:$PATH"
    done
    export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
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
