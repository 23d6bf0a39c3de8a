#!/usr/bin/env bash
# Builds the vLLM test fixture: a root filesystem in which the REAL vllm/snapshot package
# of the vLLM 0.33.0 wheel runs unmodified on top of vsnap's stand-in for the rest of
# vLLM (tests/vllm-standin/, see its README.md). Run as root; idempotent (a second run
# only checks, and takes a few seconds); no stdin; fine under CI=true.
#
# Everything lives under /var/cache/vsnap/vllm/ (VSNAP_VLLM_FIXTURE_DIR overrides):
#   dl/                 the vLLM wheel (336 MB, pinned by sha256), kept
#   wheels/             pydantic 2 + deps, uvloop and pyzmq (with its bundled libzmq): cp311
#                       manylinux x86_64 wheels, pinned
#   site-packages/      those wheels installed with pip install --target
#   snapshot-pkg/vllm/snapshot/   the wheel's vllm/snapshot/ files, unmodified (each
#                       checked against the wheel's RECORD)
#   build/cuda_utils.so the stand-in's "Triton launcher" (gcc, tests/vllm-standin/cuda_utils.c)
#   model/              a model folder for the stand-in (make_model.py: config.json, weights.bin)
#   rootfs/             the root filesystem, rebuilt when an input changes (.vsnap-fixture-stamp):
#       /usr/bin/python3.11 (Debian's) + the shared libraries ldd names + the loader,
#       /usr/lib/python3.11 (Debian's stdlib, less test/idlelib/tkinter/ensurepip/lib2to3/
#       config-*), /usr/local/lib/python3.11/dist-packages/ (pydantic, uvloop, pyzmq, vllm =
#       stand-in + the real vllm/snapshot), /opt/standin/cuda_utils.so.bin,
#       /opt/standin/asyncio-uvloop (an optional asyncio "uvloop", see the README),
#       /models/standin (the model folder), busybox (sh cat ls sleep), /etc/passwd with
#       root and engine (1000:1000, /home/engine), /tmp 1777, empty /proc /sys /dev /run.
# The last line on stdout is the rootfs path; the log goes to stderr.
set -euo pipefail

STEP=init
DIED=0
log() { printf 'vllm-fixture: %s\n' "$*" >&2; }
die() {
    DIED=1
    printf 'vllm-fixture: ERROR in step "%s": %s\n' "$STEP" "$*" >&2
    exit 1
}
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ] && [ "$DIED" -eq 0 ]; then
        printf 'vllm-fixture: ERROR in step "%s": a command failed (exit %s)\n' "$STEP" "$rc" >&2
    fi
}
trap on_exit EXIT

export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C
# System tools first: a pyenv (or similar) python3 must not shadow Debian's.
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP || true
exec </dev/null
umask 022

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STANDIN="$REPO/tests/vllm-standin"
ROOT=${VSNAP_VLLM_FIXTURE_DIR:-/var/cache/vsnap/vllm}
DL="$ROOT/dl"
WHEELS="$ROOT/wheels"
SITE="$ROOT/site-packages"
PKG="$ROOT/snapshot-pkg"
BUILD="$ROOT/build"
MODEL="$ROOT/model"
ROOTFS="$ROOT/rootfs"
LOGS="$ROOT/logs"
STAMP_NAME=.vsnap-fixture-stamp

PY=/usr/bin/python3.11   # the interpreter that goes into the rootfs
HOSTPY=/usr/bin/python3  # Debian's, for pip
VLLM_VERSION=0.33.0
VLLM_WHEEL=vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_WHEEL_SHA256=4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
# pydantic 2 with its dependencies, uvloop, and pyzmq (vLLM V1's API process and
# EngineCore talk over ZMQ; the wheel bundles libzmq 4.3.5): exact versions and hashes.
PY_REQUIREMENTS="pydantic==2.14.4 --hash=sha256:653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc
pydantic-core==2.50.5 --hash=sha256:488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70
annotated-types==0.8.0 --hash=sha256:f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0
typing-extensions==4.16.0 --hash=sha256:481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8
typing-inspection==0.4.5 --hash=sha256:bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39
uvloop==0.23.0 --hash=sha256:ab17b3a8aa754be0de0e397f7b95f13b14e56f077a4c6ae295e3d4afd199b325
pyzmq==27.3.0 --hash=sha256:477b8ad30d66fc905c5388351e83b9ac25824b00e82c0d052b72ea6392636dfd"
PY_WHEEL_COUNT=7
APT_LOCK_WAIT=600

# ---------------------------------------------------------------------------------------
STEP=preflight
[ "$(id -u)" -eq 0 ] || die "must run as root"
[ -d "$STANDIN/vllm" ] || die "$STANDIN/vllm not found (run from a vsnap checkout)"
[ ! -e "$STANDIN/vllm/snapshot" ] || die "$STANDIN/vllm/snapshot must not exist: the snapshot package comes from the wheel"
mkdir -p "$ROOT" "$DL" "$WHEELS" "$BUILD" "$LOGS"

STEP=lock
exec 8>"$ROOT/fixture.lock"
if ! flock -n 8; then
    log "another run holds $ROOT/fixture.lock; waiting for it"
    flock -w 3600 8 || die "timed out waiting for $ROOT/fixture.lock"
fi
rm -rf "$ROOT"/*.new "$ROOT"/*.old "$DL"/tmp.* "$WHEELS"/tmp.*

# ---------------------------------------------------------------------------------------
STEP=apt-packages
APT_PKGS=(python3.11 python3-pip busybox-static gcc libc6-dev)
missing=()
for p in "${APT_PKGS[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "apt: installing ${missing[*]}"
    apt-get -q -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" update >&2 ||
        die "apt-get update failed"
    apt-get -q -y --no-install-recommends -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        install "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
fi
[ -x "$PY" ] || die "$PY missing (package python3.11)"
[ -x /bin/busybox ] || die "/bin/busybox missing (package busybox-static)"
"$HOSTPY" -m pip --version >/dev/null 2>&1 || die "$HOSTPY -m pip does not run (package python3-pip)"
CHROOT=$(command -v chroot) || die "chroot not found (package coreutils)"

# ---------------------------------------------------------------------------------------
STEP=vllm-wheel
wheel="$DL/$VLLM_WHEEL"
if [ -f "$wheel" ] && [ "$(cat "$wheel.sha256-ok" 2>/dev/null || true)" = "$VLLM_WHEEL_SHA256 $(stat -c '%s %Y' "$wheel")" ]; then
    log "vllm wheel: cached $wheel"
else
    if [ -f "$wheel" ] && ! echo "$VLLM_WHEEL_SHA256  $wheel" | sha256sum --quiet -c - >/dev/null 2>&1; then
        log "vllm wheel: cached $wheel fails its checksum; fetching it again"
        rm -f "$wheel"
    fi
    if [ ! -f "$wheel" ]; then
        log "vllm wheel: downloading vllm==$VLLM_VERSION (336 MB; log: $LOGS/vllm-download.log)"
        tmp=$(mktemp -d "$DL/tmp.XXXXXX")
        printf 'vllm==%s --hash=sha256:%s\n' "$VLLM_VERSION" "$VLLM_WHEEL_SHA256" >"$tmp/requirements.txt"
        if ! "$HOSTPY" -m pip download --no-deps --require-hashes --progress-bar off \
            -r "$tmp/requirements.txt" -d "$tmp" >"$LOGS/vllm-download.log" 2>&1; then
            tail -n 20 "$LOGS/vllm-download.log" >&2
            rm -rf "$tmp"
            die "pip download vllm==$VLLM_VERSION failed"
        fi
        [ -f "$tmp/$VLLM_WHEEL" ] || { ls -la "$tmp" >&2; rm -rf "$tmp"; die "pip did not save $VLLM_WHEEL"; }
        mv -f "$tmp/$VLLM_WHEEL" "$wheel"
        rm -rf "$tmp"
    fi
    echo "$VLLM_WHEEL_SHA256  $wheel" | sha256sum --quiet -c - || { rm -f "$wheel"; die "$wheel checksum mismatch (removed; re-run)"; }
    echo "$VLLM_WHEEL_SHA256 $(stat -c '%s %Y' "$wheel")" >"$wheel.sha256-ok"
    log "vllm wheel: $wheel ($(du -h "$wheel" | cut -f1))"
fi

# ---------------------------------------------------------------------------------------
STEP=snapshot-pkg
# Only vllm/snapshot/ is taken from the wheel. The wheel's vllm/__init__.py is not:
# it imports vllm.version and vllm.env_override (torch), so the stand-in has its own.
pkg_stamp="wheel=$VLLM_WHEEL_SHA256"
if [ "$(cat "$PKG/$STAMP_NAME" 2>/dev/null || true)" = "$pkg_stamp" ]; then
    log "snapshot-pkg: up to date ($PKG/vllm/snapshot)"
else
    log "snapshot-pkg: extracting vllm/snapshot/ from $VLLM_WHEEL"
    rm -rf "$PKG.new"
    "$HOSTPY" - "$wheel" "$PKG.new" <<'PYEOF' >&2 || die "extracting vllm/snapshot/ failed"
import base64, csv, hashlib, io, os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "vllm/snapshot/"
with zipfile.ZipFile(wheel) as z:
    records = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        sys.exit(f"expected one RECORD in the wheel, found {records}")
    expected = {}
    for row in csv.reader(io.TextIOWrapper(z.open(records[0]), encoding="utf-8")):
        if row and row[0].startswith(prefix):
            expected[row[0]] = (row[1], int(row[2]))
    members = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not members or sorted(members) != sorted(expected):
        sys.exit(f"vllm/snapshot/ members {sorted(members)} != RECORD {sorted(expected)}")
    for name in sorted(members):
        data = z.read(name)
        algo, _, digest = expected[name][0].partition("=")
        got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        if got != digest or len(data) != expected[name][1]:
            sys.exit(f"{name}: does not match the wheel's RECORD")
        path = os.path.join(out, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print(f"vllm-fixture: snapshot-pkg:   {name} ({len(data)} bytes, RECORD ok)")
PYEOF
    echo "$pkg_stamp" >"$PKG.new/$STAMP_NAME"
    rm -rf "$PKG.old"
    [ ! -e "$PKG" ] || mv "$PKG" "$PKG.old"
    mv "$PKG.new" "$PKG"
    rm -rf "$PKG.old"
fi
[ -f "$PKG/vllm/snapshot/server.py" ] || die "$PKG/vllm/snapshot/server.py missing"

# ---------------------------------------------------------------------------------------
STEP=python-wheels
printf '%s\n' "$PY_REQUIREMENTS" >"$ROOT/requirements.txt.new"
mv -f "$ROOT/requirements.txt.new" "$ROOT/requirements.txt"
req_sha=$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$WHEELS/$STAMP_NAME" 2>/dev/null || true)" = "$req_sha" ]; then
    log "python wheels: cached in $WHEELS"
else
    log "python wheels: downloading pydantic 2, its dependencies, uvloop and pyzmq (cp311 manylinux x86_64)"
    tmp=$(mktemp -d "$WHEELS/tmp.XXXXXX")
    if ! "$HOSTPY" -m pip download --no-deps --require-hashes --progress-bar off \
        --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        -r "$ROOT/requirements.txt" -d "$tmp" >"$LOGS/wheels-download.log" 2>&1; then
        tail -n 20 "$LOGS/wheels-download.log" >&2
        rm -rf "$tmp"
        die "pip download of the python wheels failed"
    fi
    n=$(find "$tmp" -maxdepth 1 -name '*.whl' | wc -l)
    [ "$n" -eq "$PY_WHEEL_COUNT" ] || { ls -la "$tmp" >&2; rm -rf "$tmp"; die "expected $PY_WHEEL_COUNT wheels, got $n"; }
    find "$WHEELS" -maxdepth 1 -name '*.whl' -delete
    mv "$tmp"/*.whl "$WHEELS"/
    rm -rf "$tmp"
    echo "$req_sha" >"$WHEELS/$STAMP_NAME"
fi

STEP=site-packages
site_stamp="requirements=$req_sha python=$(dpkg-query -W -f='${Version}' python3.11)"
if [ "$(cat "$SITE/$STAMP_NAME" 2>/dev/null || true)" = "$site_stamp" ]; then
    log "site-packages: up to date ($SITE)"
else
    log "site-packages: pip install --target $SITE"
    rm -rf "$SITE.new"
    if ! "$HOSTPY" -m pip install --no-index --find-links "$WHEELS" --no-deps --require-hashes \
        --only-binary=:all: --no-compile --target "$SITE.new" \
        -r "$ROOT/requirements.txt" >"$LOGS/site-install.log" 2>&1; then
        tail -n 20 "$LOGS/site-install.log" >&2
        die "pip install --target failed"
    fi
    rm -rf "$SITE.new/bin"
    echo "$site_stamp" >"$SITE.new/$STAMP_NAME"
    rm -rf "$SITE.old"
    [ ! -e "$SITE" ] || mv "$SITE" "$SITE.old"
    mv "$SITE.new" "$SITE"
    rm -rf "$SITE.old"
fi

# ---------------------------------------------------------------------------------------
STEP=launcher
# The "compiled Triton launcher": its bytes go into the rootfs as data.
gcc -shared -fPIC -O2 -Wall -Werror -o "$BUILD/cuda_utils.so.new" "$STANDIN/cuda_utils.c" ||
    die "gcc failed on $STANDIN/cuda_utils.c"
if cmp -s "$BUILD/cuda_utils.so.new" "$BUILD/cuda_utils.so"; then
    rm -f "$BUILD/cuda_utils.so.new"
else
    mv -f "$BUILD/cuda_utils.so.new" "$BUILD/cuda_utils.so"
fi
nm -D --defined-only "$BUILD/cuda_utils.so" | grep -q ' T vsnap_launcher_ok$' ||
    die "$BUILD/cuda_utils.so does not export vsnap_launcher_ok"

STEP=model
model_stamp=$(sha256sum "$STANDIN/make_model.py" | cut -d' ' -f1)
if [ "$(cat "$MODEL/$STAMP_NAME" 2>/dev/null || true)" = "$model_stamp" ]; then
    log "model: up to date ($MODEL)"
else
    log "model: making $MODEL (tests/vllm-standin/make_model.py)"
    rm -rf "$MODEL.new"
    "$HOSTPY" "$STANDIN/make_model.py" "$MODEL.new" >/dev/null || die "make_model.py failed"
    echo "$model_stamp" >"$MODEL.new/$STAMP_NAME"
    rm -rf "$MODEL.old"
    [ ! -e "$MODEL" ] || mv "$MODEL" "$MODEL.old"
    mv "$MODEL.new" "$MODEL"
    rm -rf "$MODEL.old"
fi

# ---------------------------------------------------------------------------------------
STEP=rootfs
standin_sum=$(cd "$STANDIN" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
rootfs_stamp=$(
    {
        echo "script $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
        echo "standin $standin_sum"
        echo "snapshot-pkg $(cat "$PKG/$STAMP_NAME")"
        echo "site $(cat "$SITE/$STAMP_NAME")"
        echo "model $(cat "$MODEL/$STAMP_NAME")"
        echo "launcher $(sha256sum "$BUILD/cuda_utils.so" | cut -d' ' -f1)"
        echo "python $(sha256sum "$PY" | cut -d' ' -f1)"
        echo "busybox $(sha256sum /bin/busybox | cut -d' ' -f1)"
        # The packages of the libraries ldd copies in (libstdc++ and libgcc for libzmq).
        dpkg-query -W -f='${Package} ${Version}\n' python3.11-minimal libpython3.11-minimal \
            libpython3.11-stdlib libc6 libexpat1 zlib1g libffi8 libssl3 libstdc++6 libgcc-s1 \
            2>/dev/null || true
    } | sha256sum | cut -d' ' -f1
)
if [ "$(cat "$ROOTFS/$STAMP_NAME" 2>/dev/null || true)" = "$rootfs_stamp" ]; then
    log "rootfs: up to date ($ROOTFS, $(du -sh "$ROOTFS" | cut -f1))"
else
    log "rootfs: building $ROOTFS"
    R="$ROOTFS.new"
    rm -rf "$R"
    mkdir -p "$R"/usr/bin "$R"/usr/sbin "$R"/usr/lib "$R"/usr/lib64 "$R"/usr/local/lib/python3.11/dist-packages
    # Debian's merged-/usr layout.
    for d in bin sbin lib lib64; do ln -s "usr/$d" "$R/$d"; done
    mkdir -p "$R"/etc "$R"/opt/standin "$R"/models "$R"/root "$R"/home/engine \
        "$R"/tmp "$R"/proc "$R"/sys "$R"/dev "$R"/run
    chmod 0700 "$R/root"
    chmod 1777 "$R/tmp"
    chown 1000:1000 "$R/home/engine"
    chmod 0755 "$R/home/engine"

    STEP=rootfs-python
    install -m 0755 "$PY" "$R/usr/bin/python3.11"
    ln -s python3.11 "$R/usr/bin/python3"
    tar -C /usr/lib -cf - \
        --exclude='python3.11/test' --exclude='python3.11/idlelib' \
        --exclude='python3.11/tkinter' --exclude='python3.11/turtledemo' \
        --exclude='python3.11/ensurepip' --exclude='python3.11/lib2to3' \
        --exclude='python3.11/config-3.11-*' --exclude='python3.11/sitecustomize.py' \
        --exclude='python3.11/dist-packages' \
        --exclude='python3.11/lib-dynload/_test*' --exclude='python3.11/lib-dynload/_ctypes_test*' \
        --exclude='python3.11/lib-dynload/xxlimited*' --exclude='python3.11/lib-dynload/_xxtestfuzz*' \
        python3.11 | tar -C "$R/usr/lib" -xf - || die "copying /usr/lib/python3.11 failed"

    STEP=rootfs-packages
    DIST="$R/usr/local/lib/python3.11/dist-packages"
    cp -R "$SITE/." "$DIST/"
    rm -f "$DIST/$STAMP_NAME"
    (cd "$STANDIN" && find vllm -name __pycache__ -prune -o -type f -name '*.py' -print0 |
        xargs -0 -I{} install -D -m 0644 {} "$DIST/{}") || die "copying the stand-in failed"
    [ ! -e "$DIST/vllm/snapshot" ] || die "the stand-in brought a vllm/snapshot"
    mkdir -p "$DIST/vllm/snapshot"
    for f in "$PKG"/vllm/snapshot/*; do install -m 0644 "$f" "$DIST/vllm/snapshot/"; done
    install -D -m 0644 "$STANDIN/uvloop-asyncio/uvloop/__init__.py" \
        "$R/opt/standin/asyncio-uvloop/uvloop/__init__.py"
    install -m 0644 "$BUILD/cuda_utils.so" "$R/opt/standin/cuda_utils.so.bin"
    install -m 0644 "$STANDIN/make_model.py" "$R/opt/standin/make_model.py"
    mkdir -p "$R/models/standin"
    install -m 0644 "$MODEL/config.json" "$MODEL/weights.bin" "$R/models/standin/"

    STEP=rootfs-busybox
    install -m 0755 /bin/busybox "$R/usr/bin/busybox"
    for a in sh cat ls sleep; do ln -s busybox "$R/usr/bin/$a"; done

    STEP=rootfs-etc
    printf 'root:x:0:0:root:/root:/bin/sh\nengine:x:1000:1000:engine:/home/engine:/bin/sh\n' >"$R/etc/passwd"
    printf 'root:x:0:\nengine:x:1000:\n' >"$R/etc/group"
    chmod 0644 "$R/etc/passwd" "$R/etc/group"

    STEP=rootfs-libraries
    # Every ELF object that can be loaded: the interpreter, the stdlib's and the
    # wheels' extension modules. ldd resolves their libraries (and the loader).
    libs=$(
        {
            echo "$R/usr/bin/python3.11"
            find "$R/usr/lib/python3.11/lib-dynload" "$DIST" -name '*.so*' -type f
        } | while read -r obj; do
            out=$(ldd "$obj" 2>&1) || continue
            if grep -q 'not found' <<<"$out"; then
                echo "MISSING $obj: $(grep 'not found' <<<"$out" | tr '\n' ' ')"
            fi
            grep -o '/[^ ]*' <<<"$out" || true
        done | sort -u
    )
    if grep -q '^MISSING' <<<"$libs"; then
        grep '^MISSING' <<<"$libs" >&2
        die "unresolved shared libraries"
    fi
    for lib in $libs; do
        case "$lib" in "$R"/*) continue ;; esac
        [ -f "$lib" ] || die "ldd named $lib, which is not a file"
        mkdir -p "$R$(dirname "$lib")"
        [ -e "$R$lib" ] || cp -L "$lib" "$R$lib"
    done
    [ -x "$R/lib64/ld-linux-x86-64.so.2" ] || die "the dynamic loader did not make it into the rootfs"

    STEP=rootfs-compile
    # Byte-compile what has no .pyc yet (the stand-in, the wheels, stdlib stragglers),
    # so a read-only rootfs starts without compiling.
    env -i PATH=/usr/bin:/bin HOME=/root LC_ALL=C.UTF-8 "$CHROOT" "$R" /usr/bin/python3.11 -m compileall -q \
        /usr/lib/python3.11 /usr/local/lib/python3.11/dist-packages /opt/standin/asyncio-uvloop \
        >"$LOGS/compileall.log" 2>&1 || {
        tail -n 20 "$LOGS/compileall.log" >&2
        die "compileall in the rootfs failed"
    }

    STEP=rootfs-verify
    out=$(env -i PATH=/usr/bin:/bin HOME=/root "$CHROOT" "$R" /usr/bin/python3.11 -c '
import sys, ctypes, pydantic, uvloop, zmq, vllm, vllm.snapshot.server
import vllm.v1.engine.core, vllm.v1.engine.async_llm, vllm.entrypoints.launchers.api_server.entry
lib = ctypes.CDLL("/opt/standin/cuda_utils.so.bin")
assert lib.vsnap_launcher_ok() == 42
print(sys.version.split()[0], "pydantic", pydantic.VERSION, "uvloop", uvloop.__version__,
      "pyzmq", zmq.__version__, "libzmq", zmq.zmq_version(), "vllm", vllm.__version__)
' 2>&1) || { printf '%s\n' "$out" >&2; die "python does not run in the rootfs"; }
    log "rootfs: python $out"
    out=$(env -i PATH=/usr/bin:/bin HOME=/root PYTHONPATH=/opt/standin/asyncio-uvloop "$CHROOT" "$R" \
        /usr/bin/python3.11 -c 'import uvloop; assert uvloop.VSNAP_STANDIN; print(uvloop.run(__import__("asyncio").sleep(0, "ok")))' 2>&1) ||
        { printf '%s\n' "$out" >&2; die "the asyncio uvloop does not run in the rootfs"; }
    out=$(env -i PATH=/usr/bin:/bin "$CHROOT" "$R" /bin/sh -c 'ls / >/dev/null && cat /etc/passwd >/dev/null && sleep 0 && echo ok' 2>&1) ||
        { printf '%s\n' "$out" >&2; die "busybox does not run in the rootfs"; }

    echo "$rootfs_stamp" >"$R/$STAMP_NAME"
    STEP=rootfs-install
    rm -rf "$ROOTFS.old"
    [ ! -e "$ROOTFS" ] || mv "$ROOTFS" "$ROOTFS.old"
    mv "$R" "$ROOTFS"
    rm -rf "$ROOTFS.old"
    log "rootfs: built $ROOTFS ($(du -sh "$ROOTFS" | cut -f1))"
fi

STEP=done
echo "$ROOTFS"
