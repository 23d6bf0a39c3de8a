#!/usr/bin/env bash
# Host setup for vsnap (containerd runtime shim) on Debian 12 (bookworm), run as root.
#
# Installs, idempotently (a second run only checks, and takes a few seconds):
#   * from the machine's own apt sources (bookworm): runc, iptables, CRIU's build
#     dependencies, iproute2, procps, util-linux, containernetworking-plugins (CNI
#     plugins in /usr/lib/cni for the CRI tests' pod network);
#   * containerd 2.1.x from Debian sid (.deb fetched through a PRIVATE apt configuration,
#     extracted with dpkg -x): containerd, ctr, containerd-shim-runc-v2 into
#     /opt/vsnap/containerd/bin/ (sid's runc is not used: it needs a newer glibc);
#   * Docker Engine 28.x from Debian sid (.debs docker.io and docker-cli fetched through
#     the same private apt configuration, extracted with dpkg -x): dockerd, docker-proxy
#     and the docker CLI into /opt/vsnap/docker/bin/ (no service, no system socket: the
#     tests and docs/docker.md start a dockerd of their own against a private containerd);
#   * CRIU 4.2.x built from Debian sid's source tarball: /usr/local/sbin/criu and
#     /usr/lib/criu/cuda_plugin.so (CRIU's compiled-in plugin folder);
#   * Debian's docker-registry (the CNCF distribution registry 2.8) for the fleet tests,
#     which start their own on a free loopback port; the packaged service is kept from
#     starting and disabled, so it never holds port 5000;
#   * the vLLM test fixture (scripts/vllm-fixture.sh): a root filesystem under
#     /var/cache/vsnap/vllm/rootfs in which vLLM 0.33.0's own vllm/snapshot package (from
#     its wheel on PyPI) runs on vsnap's stand-in for the rest of vLLM
#     (tests/vllm-standin/README.md);
#   * /opt/vsnap/versions.txt with the installed versions.
# It checks that the Rust toolchain (cargo) exists but does not install it.
# The system's apt sources and sysctl settings are left as they are. Downloads and the
# CRIU build tree live under /var/cache/vsnap/ so re-runs reuse them.
# What each step installs and why: docs/host-setup.md.
set -euo pipefail

STEP=init
DIED=0
log() { printf 'setup: %s\n' "$*"; }
die() {
    DIED=1
    printf 'setup: ERROR in step "%s": %s\n' "$STEP" "$*" >&2
    exit 1
}
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ] && [ "$DIED" -eq 0 ]; then
        printf 'setup: ERROR in step "%s": a command failed (exit %s)\n' "$STEP" "$rc" >&2
    fi
}
trap on_exit EXIT

export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C
# System tools first (a pyenv or similar python3 shim must not shadow /usr/bin/python3).
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
# Never read stdin; never inherit a parent make's jobserver.
exec </dev/null
unset MAKEFLAGS MFLAGS MAKELEVEL || true
umask 022

CACHE=/var/cache/vsnap
DL="$CACHE/dl"
BUILD="$CACHE/build"
PRIV="$CACHE/apt"
PREFIX=/opt/vsnap
CTR_BIN="$PREFIX/containerd/bin"
CRIU_BIN=/usr/local/sbin/criu
CRIU_PLUGINDIR=/usr/lib/criu
CONTAINERD_SERIES=2.1
DOCKER_BIN="$PREFIX/docker/bin"
DOCKER_SERIES=28
CRIU_SERIES=4.2
APT_LOCK_WAIT=600

# ---------------------------------------------------------------------------------------
STEP=preflight
[ "$(id -u)" -eq 0 ] || die "must run as root"
if [ -r /etc/os-release ]; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ "$codename" = bookworm ] || log "warning: written for Debian bookworm, this is '${codename:-unknown}'"
fi
mkdir -p "$CACHE" "$DL" "$BUILD"

STEP=lock
exec 9>"$CACHE/setup.lock"
if ! flock -n 9; then
    log "another setup run holds $CACHE/setup.lock; waiting for it"
    flock -w 3600 9 || die "timed out waiting for $CACHE/setup.lock"
fi
# Leftovers of an interrupted run (safe to remove while holding the lock).
rm -rf "$BUILD"/unpack.* "$CACHE"/containerd-x.* "$CACHE"/docker-x.*

# ---------------------------------------------------------------------------------------
STEP=rust
if ! command -v cargo >/dev/null 2>&1; then
    for d in ${CARGO_HOME:+"$CARGO_HOME/bin"} ${HOME:+"$HOME/.cargo/bin"} /root/.cargo/bin; do
        if [ -x "$d/cargo" ]; then
            export PATH="$PATH:$d"
            break
        fi
    done
fi
command -v cargo >/dev/null 2>&1 ||
    die "cargo not found on PATH nor in \$HOME/.cargo/bin: install the Rust toolchain (rustup) first; this script does not install Rust"
cargo_version=$(cargo --version 2>&1) || die "cargo is present but does not run: $cargo_version"
log "rust: $cargo_version ($(command -v cargo))"

# ---------------------------------------------------------------------------------------
STEP=apt-packages
APT_PKGS=(
    runc iptables iproute2 procps util-linux busybox-static bsdutils curl patch
    build-essential pkg-config xz-utils debian-archive-keyring
    libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
    libnl-3-dev libnet1-dev libcap-dev libaio-dev libbsd-dev libgnutls28-dev uuid-dev
    libnftables-dev
    containernetworking-plugins
)
missing=()
for p in "${APT_PKGS[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
    log "apt: all ${#APT_PKGS[@]} packages already installed"
else
    log "apt: installing ${missing[*]}"
    apt-get -q -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" update ||
        die "apt-get update (system sources) failed"
    apt-get -q -y --no-install-recommends \
        -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        install "${missing[@]}" || die "apt-get install ${missing[*]} failed"
fi

# ---------------------------------------------------------------------------------------
# A Debian package whose service the tests never use: installed with the service kept
# from starting (a policy-rc.d that refuses every start, ours only while we install),
# then disabled where systemd runs. Idempotent: an installed package is left alone.
install_without_service() { # PACKAGE SERVICE
    local pkg=$1 svc=$2 st policy own_policy rc
    st=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [ "$st" = "install ok installed" ]; then
        log "$pkg: already installed"
    else
        log "$pkg: installing (its service kept from starting)"
        policy=/usr/sbin/policy-rc.d
        own_policy=0
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\n# vsnap setup: no service starts while packages install\nexit 101\n' >"$policy"
            chmod 0755 "$policy"
            own_policy=1
        fi
        rc=0
        apt-get -q -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" update >/dev/null 2>&1 || true
        apt-get -q -y --no-install-recommends \
            -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            install "$pkg" || rc=$?
        [ "$own_policy" -eq 1 ] && rm -f "$policy"
        [ "$rc" -eq 0 ] || die "apt-get install $pkg failed"
    fi
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        if systemctl is-enabled --quiet "$svc.service" 2>/dev/null ||
            systemctl is-active --quiet "$svc.service" 2>/dev/null; then
            systemctl disable --now "$svc.service" >/dev/null 2>&1 ||
                die "cannot disable the packaged $svc service"
            log "$pkg: packaged service disabled (tests run their own)"
        fi
    fi
}

# ---------------------------------------------------------------------------------------
STEP=docker-registry
# The OCI registry the fleet tests push to and pull from (docs/fleet.md). Every test
# runs its own (`docker-registry serve <config>`, filesystem storage in its scratch
# folder, 127.0.0.1 and a free port); the packaged service is never needed.
install_without_service docker-registry docker-registry
command -v docker-registry >/dev/null 2>&1 || die "docker-registry not on PATH after install"
log "docker-registry: $(docker-registry --version 2>/dev/null || echo '?')"

# ---------------------------------------------------------------------------------------
STEP=prometheus
# `vsnap metrics` is checked by Debian's promtool (`promtool check metrics`) and
# scraped by a real Prometheus server in an e2e test (its own data dir, config and
# port, started and stopped by pid); the packaged service is never needed.
install_without_service prometheus prometheus
for tool in prometheus promtool; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not on PATH after installing prometheus"
done
log "prometheus: $(prometheus --version 2>&1 | head -n 1)"

# ---------------------------------------------------------------------------------------
# Private apt configuration for Debian sid: the system's sources stay untouched. The mirror
# is taken from the machine's own Debian source entry.
PRIV_READY=0
priv_apt() {
    apt-get -o Dir::Etc::SourceList="$PRIV/sid.list" -o Dir::Etc::SourceParts=- \
        -o Dir::State::Lists="$PRIV/lists" -o Dir::Cache="$PRIV/cache" \
        -o APT::Sandbox::User=root -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
        "$@"
}
priv_apt_cache() {
    apt-cache -o Dir::Etc::SourceList="$PRIV/sid.list" -o Dir::Etc::SourceParts=- \
        -o Dir::State::Lists="$PRIV/lists" -o Dir::Cache="$PRIV/cache" "$@"
}
priv_apt_setup() {
    [ "$PRIV_READY" -eq 1 ] && return 0
    local src=/etc/apt/sources.list.d/debian.sources mirror key=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$src" ] || die "$src not found: cannot derive the Debian mirror"
    mirror=$(awk '/^URIs:/{print $2; exit}' "$src")
    [ -n "$mirror" ] || die "no URIs: line in $src"
    [ -r "$key" ] || die "$key missing (package debian-archive-keyring)"
    mkdir -p "$PRIV/lists/partial" "$PRIV/cache/archives/partial"
    printf 'deb [signed-by=%s] %s sid main\ndeb-src [signed-by=%s] %s sid main\n' \
        "$key" "$mirror" "$key" "$mirror" >"$PRIV/sid.list.new"
    mv -f "$PRIV/sid.list.new" "$PRIV/sid.list"
    log "private apt: updating sid index from $mirror (system sources untouched)"
    priv_apt -q update >"$PRIV/update.log" 2>&1 || {
        tail -n 20 "$PRIV/update.log" >&2
        die "private apt-get update for sid failed (log: $PRIV/update.log)"
    }
    PRIV_READY=1
}
# Highest of the versions on stdin that belong to series $1 (e.g. 2.1 -> 2.1.9+ds1-5).
pick_series() { grep -E "^$(printf '%s' "$1" | sed 's/\./\\./g')[.~+-]" | sort -V | tail -n 1; }

# ---------------------------------------------------------------------------------------
STEP=containerd
containerd_ok() {
    local b
    for b in containerd ctr containerd-shim-runc-v2; do [ -x "$CTR_BIN/$b" ] || return 1; done
    "$CTR_BIN/containerd" --version 2>/dev/null | grep -E " v?${CONTAINERD_SERIES//./\\.}\." >/dev/null
}
if containerd_ok; then
    log "containerd: already installed: $("$CTR_BIN/containerd" --version)"
else
    arch=$(dpkg --print-architecture)
    deb=$(ls -1 "$DL"/containerd_"$CONTAINERD_SERIES".*_"$arch".deb 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$deb" ] && ! dpkg-deb --info "$deb" >/dev/null 2>&1; then
        log "containerd: cached $deb is unreadable; fetching it again"
        rm -f "$deb"
        deb=
    fi
    if [ -z "$deb" ]; then
        priv_apt_setup
        ver=$(priv_apt_cache show containerd 2>/dev/null | awk '/^Version:/{print $2}' | pick_series "$CONTAINERD_SERIES" || true)
        [ -n "$ver" ] || die "Debian sid offers no containerd $CONTAINERD_SERIES.x (has: $(priv_apt_cache show containerd 2>/dev/null | awk '/^Version:/{printf "%s ", $2}'))"
        log "containerd: downloading containerd=$ver from sid"
        (cd "$DL" && priv_apt -q download "containerd=$ver") || die "download of containerd=$ver failed"
        deb=$(ls -1 "$DL"/containerd_"$CONTAINERD_SERIES".*_"$arch".deb 2>/dev/null | sort -V | tail -n 1 || true)
        [ -n "$deb" ] || die "containerd .deb not found in $DL after download"
    fi
    log "containerd: extracting $(basename "$deb") into $CTR_BIN"
    tmp=$(mktemp -d "$CACHE/containerd-x.XXXXXX")
    dpkg -x "$deb" "$tmp" || { rm -rf "$tmp" "$deb"; die "dpkg -x $deb failed (cached .deb removed; re-run)"; }
    mkdir -p "$CTR_BIN"
    for b in containerd ctr containerd-shim-runc-v2; do
        [ -x "$tmp/usr/bin/$b" ] || { rm -rf "$tmp"; die "$b missing from $deb"; }
        install -m 0755 "$tmp/usr/bin/$b" "$CTR_BIN/.$b.new"
        mv -f "$CTR_BIN/.$b.new" "$CTR_BIN/$b"
    done
    rm -rf "$tmp"
    rm -f "$CTR_BIN/runc" # sid's runc needs GLIBC_2.38; bookworm's /usr/sbin/runc is used
    containerd_ok || die "installed containerd does not report version $CONTAINERD_SERIES.x"
    log "containerd: installed: $("$CTR_BIN/containerd" --version)"
fi

# ---------------------------------------------------------------------------------------
STEP=docker
# Docker Engine from sid's docker.io (dockerd, docker-proxy) and docker-cli (docker).
# They link only glibc 2.34 and bookworm's own libraries, so they run here as extracted.
docker_ok() {
    local b
    for b in dockerd docker-proxy docker; do [ -x "$DOCKER_BIN/$b" ] || return 1; done
    "$DOCKER_BIN/dockerd" --version 2>/dev/null | grep -E "^Docker version ${DOCKER_SERIES}\." >/dev/null &&
        "$DOCKER_BIN/docker" --version 2>/dev/null | grep -E "^Docker version ${DOCKER_SERIES}\." >/dev/null
}
# Sets DEB to the cached .deb of package $1 in series DOCKER_SERIES, downloaded from sid
# if missing.
docker_deb() {
    local pkg=$1 arch deb ver
    arch=$(dpkg --print-architecture)
    deb=$(ls -1 "$DL/${pkg}_${DOCKER_SERIES}".*_"$arch".deb 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$deb" ] && ! dpkg-deb --info "$deb" >/dev/null 2>&1; then
        rm -f "$deb"
        deb=
    fi
    if [ -z "$deb" ]; then
        priv_apt_setup
        ver=$(priv_apt_cache show "$pkg" 2>/dev/null | awk '/^Version:/{print $2}' | pick_series "$DOCKER_SERIES" || true)
        [ -n "$ver" ] || die "Debian sid offers no $pkg $DOCKER_SERIES.x"
        log "docker: downloading $pkg=$ver from sid"
        (cd "$DL" && priv_apt -q download "$pkg=$ver") || die "download of $pkg=$ver failed"
        deb=$(ls -1 "$DL/${pkg}_${DOCKER_SERIES}".*_"$arch".deb 2>/dev/null | sort -V | tail -n 1 || true)
        [ -n "$deb" ] || die "$pkg .deb not found in $DL after download"
    fi
    DEB=$deb
}
if docker_ok; then
    log "docker: already installed: $("$DOCKER_BIN/dockerd" --version)"
else
    docker_deb docker.io
    engine_deb=$DEB
    docker_deb docker-cli
    cli_deb=$DEB
    tmp=$(mktemp -d "$CACHE/docker-x.XXXXXX")
    for deb in "$engine_deb" "$cli_deb"; do
        dpkg -x "$deb" "$tmp" || { rm -rf "$tmp" "$deb"; die "dpkg -x $deb failed (cached .deb removed; re-run)"; }
    done
    mkdir -p "$DOCKER_BIN"
    for b in usr/sbin/dockerd usr/sbin/docker-proxy usr/bin/docker; do
        [ -x "$tmp/$b" ] || { rm -rf "$tmp"; die "$b missing from $(basename "$engine_deb") / $(basename "$cli_deb")"; }
        install -m 0755 "$tmp/$b" "$DOCKER_BIN/.$(basename "$b").new"
        mv -f "$DOCKER_BIN/.$(basename "$b").new" "$DOCKER_BIN/$(basename "$b")"
    done
    rm -rf "$tmp"
    docker_ok || die "installed dockerd/docker do not report version $DOCKER_SERIES.x"
    log "docker: installed: $("$DOCKER_BIN/dockerd" --version)"
fi

# ---------------------------------------------------------------------------------------
STEP=criu
# vsnap's patch to CRIU (scripts/criu-join-ns-root.patch, docs/host-setup.md): a
# restore that joins the pod's UTS and IPC namespaces (--join-ns) puts the tree in
# them instead of in new ones. A patched CRIU says so in its --version.
CRIU_PATCH="$(cd "$(dirname "$0")" && pwd)/criu-join-ns-root.patch"
CRIU_PATCH_MARK="vsnap: join-ns-root"
criu_ok() {
    [ -x "$CRIU_BIN" ] && [ -f "$CRIU_PLUGINDIR/cuda_plugin.so" ] &&
        "$CRIU_BIN" --version 2>/dev/null | grep -E "^Version: ${CRIU_SERIES//./\\.}(\.|$)" >/dev/null &&
        "$CRIU_BIN" --version 2>/dev/null | grep -qxF "$CRIU_PATCH_MARK"
}
if criu_ok; then
    log "criu: already installed: $("$CRIU_BIN" --version | head -n 1) at $CRIU_BIN, plugin in $CRIU_PLUGINDIR"
else
    # Source tarball (only the .orig.tar.xz matters; the debian.tar.xz may 404).
    orig=$(ls -1 "$DL"/criu_"$CRIU_SERIES"*.orig.tar.xz 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$orig" ] && ! (cd "$DL" && sha256sum --quiet -c "$(basename "$orig").sha256" >/dev/null 2>&1); then
        log "criu: cached $(basename "$orig") fails its checksum; fetching it again"
        rm -f "$orig" "$orig.sha256"
        orig=
    fi
    if [ -z "$orig" ]; then
        priv_apt_setup
        ver=$(priv_apt_cache showsrc criu 2>/dev/null | awk '/^Version:/{print $2}' | pick_series "$CRIU_SERIES" || true)
        [ -n "$ver" ] || die "Debian sid offers no criu $CRIU_SERIES.x source"
        uri_line=$(cd "$DL" && priv_apt -q source --print-uris "criu=$ver" 2>/dev/null | grep -E "^'.*\.orig\.tar\.xz' " | head -n 1 || true)
        [ -n "$uri_line" ] || die "no .orig.tar.xz listed for criu=$ver"
        orig_name=$(awk '{print $2}' <<<"$uri_line")
        orig_sha=$(awk '{print $4}' <<<"$uri_line")
        case "$orig_sha" in SHA256:*) orig_sha=${orig_sha#SHA256:} ;; *) die "no SHA256 for $orig_name in sid's Sources" ;; esac
        log "criu: downloading source criu=$ver from sid"
        # The debian.tar.xz may 404: apt-get then fails, but the .orig.tar.xz is what we need.
        (cd "$DL" && priv_apt -q source --download-only "criu=$ver") >"$DL/criu-source.log" 2>&1 || true
        [ -f "$DL/$orig_name" ] || { cat "$DL/criu-source.log" >&2; die "$orig_name was not downloaded"; }
        printf '%s  %s\n' "$orig_sha" "$orig_name" >"$DL/$orig_name.sha256"
        (cd "$DL" && sha256sum --quiet -c "$orig_name.sha256") ||
            { rm -f "$DL/$orig_name" "$DL/$orig_name.sha256"; die "$orig_name checksum mismatch (removed; re-run)"; }
        orig="$DL/$orig_name"
    fi
    # Unpack once into the build tree (re-used by later runs).
    src_name=$(basename "$orig" .orig.tar.xz)   # criu_4.2.1
    src="$BUILD/${src_name/_/-}"                # criu-4.2.1
    # A tree unpacked before the patch (or with another version of it) is unpacked again.
    patch_sum=$(sha256sum "$CRIU_PATCH" | awk '{print $1}')
    if [ -f "$src/.vsnap-unpacked" ] && [ "$(cat "$src/.vsnap-patched" 2>/dev/null)" != "$patch_sum" ]; then
        rm -f "$src/.vsnap-unpacked"
    fi
    if [ ! -f "$src/.vsnap-unpacked" ]; then
        log "criu: unpacking $(basename "$orig") into $src"
        rm -rf "$src"
        tmp=$(mktemp -d "$BUILD/unpack.XXXXXX")
        tar -xJf "$orig" -C "$tmp" || { rm -rf "$tmp"; die "cannot unpack $orig"; }
        top=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n 1)
        [ -n "$top" ] && [ -f "$top/Makefile" ] || { rm -rf "$tmp"; die "unexpected layout in $orig"; }
        mv "$top" "$src"
        rm -rf "$tmp"
        log "criu: applying $(basename "$CRIU_PATCH")"
        patch -d "$src" -p1 --quiet <"$CRIU_PATCH" || die "cannot apply $CRIU_PATCH to $src"
        printf '%s\n' "$patch_sum" >"$src/.vsnap-patched"
        touch "$src/.vsnap-unpacked"
    fi
    log "criu: building in $src (make -j2 criu; make cuda_plugin; log: $BUILD/criu-build.log)"
    STEP=criu-build
    if ! { make -C "$src" -j2 criu && make -C "$src" cuda_plugin; } >"$BUILD/criu-build.log" 2>&1; then
        tail -n 40 "$BUILD/criu-build.log" >&2
        die "CRIU build failed (full log: $BUILD/criu-build.log)"
    fi
    [ -x "$src/criu/criu" ] || die "build produced no $src/criu/criu"
    [ -f "$src/plugins/cuda/cuda_plugin.so" ] || die "build produced no $src/plugins/cuda/cuda_plugin.so"
    STEP=criu-install
    install -m 0755 "$src/criu/criu" "$(dirname "$CRIU_BIN")/.criu.new"
    mv -f "$(dirname "$CRIU_BIN")/.criu.new" "$CRIU_BIN"
    mkdir -p "$CRIU_PLUGINDIR"
    # Temporary name without a .so suffix: CRIU loads every *.so in that folder.
    install -m 0644 "$src/plugins/cuda/cuda_plugin.so" "$CRIU_PLUGINDIR/.cuda_plugin.new"
    mv -f "$CRIU_PLUGINDIR/.cuda_plugin.new" "$CRIU_PLUGINDIR/cuda_plugin.so"
    criu_ok || die "installed $CRIU_BIN does not report version $CRIU_SERIES.x and \"$CRIU_PATCH_MARK\""
    log "criu: installed $("$CRIU_BIN" --version | head -n 1) at $CRIU_BIN, cuda_plugin.so in $CRIU_PLUGINDIR"
fi

# ---------------------------------------------------------------------------------------
STEP=verify
[ "$(command -v criu)" = "$CRIU_BIN" ] ||
    log "warning: 'criu' on PATH is $(command -v criu), not $CRIU_BIN (runc uses the first on PATH)"
command -v runc >/dev/null 2>&1 || die "runc not found on PATH"
command -v iptables-restore >/dev/null 2>&1 || die "iptables-restore not found (CRIU's network lock needs it)"
if check_out=$("$CRIU_BIN" check 2>&1); then
    printf '%s\n' "$check_out" | sed 's/^/setup: criu check: /'
else
    printf '%s\n' "$check_out" >&2
    die "'criu check' failed on this kernel"
fi

# ---------------------------------------------------------------------------------------
STEP=versions
{
    echo "# vsnap host setup: installed versions"
    echo "containerd: $("$CTR_BIN/containerd" --version)"
    echo "containerd-path: $CTR_BIN/containerd"
    runc --version | sed 's/^/runc: /'
    echo "runc-path: $(command -v runc)"
    "$CRIU_BIN" --version | sed 's/^/criu: /'
    echo "criu-path: $CRIU_BIN"
    echo "docker-registry: $(docker-registry --version 2>/dev/null || echo '?')"
    echo "dockerd: $("$DOCKER_BIN/dockerd" --version)"
    echo "docker: $("$DOCKER_BIN/docker" --version)"
    echo "docker-path: $DOCKER_BIN"
    echo "prometheus: $(prometheus --version 2>&1 | head -n 1)"
    echo "criu-plugins: $CRIU_PLUGINDIR/cuda_plugin.so"
} >"$PREFIX/.versions.txt.new"
if cmp -s "$PREFIX/.versions.txt.new" "$PREFIX/versions.txt"; then
    rm -f "$PREFIX/.versions.txt.new"
    log "versions: $PREFIX/versions.txt unchanged"
else
    mv -f "$PREFIX/.versions.txt.new" "$PREFIX/versions.txt"
    log "versions: wrote $PREFIX/versions.txt"
fi
sed 's/^/setup:   /' "$PREFIX/versions.txt"

# ---------------------------------------------------------------------------------------
STEP=vllm-fixture
# The vLLM test engine: the real vllm/snapshot package of the vLLM 0.33.0 wheel on the
# stand-in in tests/vllm-standin/, as a root filesystem (cached; rebuilt only when an
# input changes). Its own log goes to stderr; it prints the rootfs path.
vllm_rootfs=$(bash "$(dirname "${BASH_SOURCE[0]}")/vllm-fixture.sh") ||
    die "scripts/vllm-fixture.sh failed (see its messages above)"
[ -x "$vllm_rootfs/usr/bin/python3.11" ] || die "scripts/vllm-fixture.sh printed '$vllm_rootfs', not a rootfs"
log "vllm-fixture: rootfs $vllm_rootfs ($(du -sh "$vllm_rootfs" | cut -f1))"

STEP=done
log "done"
