#!/usr/bin/env bash
# Smoke test of the vLLM fixture outside containers: runs the REAL
# `python3.11 -m vllm.snapshot.server` of the rootfs as PID 1 of a new pid namespace
# (unshare -p -f -m, chroot), with a scratch control dir bind-mounted at
# /run/vsnap/control and tmpfs over /dev, /dev/shm, /tmp, /run, /root and /home/engine
# (the cached rootfs is never written). Run as root:
#
#   tests/vllm-standin/smoke.sh [ROOTFS]      (default: what scripts/vllm-fixture.sh prints)
#
# Ends with "N passed, N failed"; exits non-zero when a check failed.
set -uo pipefail
export LC_ALL=C
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"

# --- inside the new namespaces: set up the mounts, then exec the command ------------
if [ "${1:-}" = __enter ]; then
    R=$2 CTL=$3 MODEL_DIR=$4
    shift 4
    set -e
    mount -t proc proc "$R/proc"
    mount -t tmpfs -o mode=755 tmpfs "$R/dev"
    for d in null:1:3 zero:1:5 random:1:8 urandom:1:9; do
        n=${d%%:*} r=${d#*:}
        mknod -m 666 "$R/dev/$n" c "${r%:*}" "${r#*:}"
    done
    mkdir "$R/dev/shm"
    mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
    mount -t tmpfs -o mode=700 tmpfs "$R/root"
    mount -t tmpfs -o mode=755,uid=1000,gid=1000 tmpfs "$R/home/engine"
    mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
    mount -t tmpfs -o mode=755 tmpfs "$R/run"
    mkdir -p "$R/run/vsnap/control"
    mount --bind "$CTL" "$R/run/vsnap/control"
    [ -z "$MODEL_DIR" ] || mount --bind "$MODEL_DIR" "$R/models/standin"
    exec "$@"
fi

[ "$(id -u)" -eq 0 ] || { echo "smoke: must run as root" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOTFS=${1:-$("$HERE/../../scripts/vllm-fixture.sh")} || { echo "smoke: fixture failed" >&2; exit 2; }
[ -x "$ROOTFS/usr/bin/python3.11" ] || { echo "smoke: $ROOTFS is not the fixture rootfs" >&2; exit 2; }
CHROOT=$(command -v chroot)
HOSTPY=/usr/bin/python3
WORK=$(mktemp -d /tmp/vllm-smoke.XXXXXX)
PASSED=0
FAILED=0
STARTED=()

pass() { PASSED=$((PASSED + 1)); printf 'smoke: ok   %s\n' "$*"; }
fail() { FAILED=$((FAILED + 1)); printf 'smoke: FAIL %s\n' "$*"; }
check() { # check NAME COMMAND...
    local name=$1
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}
cleanup() {
    local n p
    for n in "${STARTED[@]}"; do
        p=$(pid1 "$n")
        [ -z "$p" ] || kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { "$HOSTPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start NAME USER MODEL_DIR ENV... -- SERVE_ARGS...: starts an engine in the background.
start() {
    local name=$1 user=$2 model=$3
    shift 3
    local envs=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local d="$WORK/$name" home=/root
    [ "$user" = 0 ] || home=/home/engine
    mkdir -p "$d/ctl"
    chmod 0700 "$d/ctl"
    chown "$user:$user" "$d/ctl"
    date +%s.%N >"$d/t0"
    unshare --pid --fork --mount --propagation private \
        "$HERE/smoke.sh" __enter "$ROOTFS" "$d/ctl" "$model" \
        env -i HOME=$home PATH=/usr/bin:/bin VLLM_WORKER_MULTIPROC_METHOD=spawn "${envs[@]}" \
        "$CHROOT" --userspec="$user:$user" "$ROOTFS" \
        /usr/bin/python3.11 -m vllm.snapshot.server \
        --ready-file /run/vsnap/control/ready.json --release-file /run/vsnap/control/release.json \
        -- /models/standin "$@" </dev/null >"$d/stdout.log" 2>"$d/stderr.log" &
    echo $! >"$d/unshare.pid"
    STARTED+=("$name")
}
pid1() { # host pid of the namespace's PID 1 (the server)
    local u
    u=$(cat "$WORK/$1/unshare.pid")
    cat "/proc/$u/task/$u/children" 2>/dev/null | awk '{print $1}'
}
alive() { [ -d "/proc/$(cat "$WORK/$1/unshare.pid")" ] && [ -n "$(pid1 "$1")" ]; }
wait_ready() { # wait_ready NAME: prints the cold start in seconds
    local d="$WORK/$1" i
    for i in $(seq 1 600); do
        if [ -f "$d/ctl/ready.json" ]; then
            "$HOSTPY" -c "import sys; print(round($(date +%s.%N) - $(cat "$d/t0"), 2))"
            return 0
        fi
        alive "$1" || break
        sleep 0.05
    done
    echo "engine $1 wrote no ready file; stdout:" >&2
    tail -n 30 "$d/stdout.log" "$d/stderr.log" >&2
    return 1
}
release() { # release NAME JSON: atomic write of the release file
    local d="$WORK/$1/ctl"
    printf '%s' "$2" >"$d/release.json.tmp"
    mv -f "$d/release.json.tmp" "$d/release.json"
}
wait_listen() { # wait_listen PORT
    local i
    for i in $(seq 1 200); do
        curl -s -o /dev/null "http://127.0.0.1:$1/health" && return 0
        sleep 0.05
    done
    return 1
}
canary() { # canary PORT [AUTH]: prints the canary answer as JSON [ids, text, logprob]
    local port=$1 auth=${2:-}
    curl -s -X POST "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
        ${auth:+-H "Authorization: Bearer $auth"} \
        -d '{"model":"standin","prompt":"The capital of France is","min_tokens":1,"max_tokens":1,"temperature":0,"seed":0,"logprobs":0,"return_token_ids":true}' |
        "$HOSTPY" -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print(json.dumps([c["token_ids"], c["text"], c["logprobs"]["token_logprobs"][0]]))'
}
ready_oracle() { "$HOSTPY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps([r["token_ids"], r["text"], r["sampled_token_logprob"]]))' "$WORK/$1/ctl/ready.json"; }
matches() { # matches JSON_A JSON_B: the oracle rule (ids, text equal; logprob within 1e-3)
    "$HOSTPY" -c 'import json,sys,math; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); sys.exit(0 if a[0]==b[0] and a[1]==b[1] and math.isclose(a[2],b[2],rel_tol=0,abs_tol=1e-3) else 1)' "$1" "$2"
}
zmq_sockets() { # zmq_sockets PID1: "stale live" counts of the socket files in its /tmp
    # A live one is bound by a listening socket that PID 1 holds (/proc/PID/net/unix:
    # flag __SO_ACCEPTCON, the inode among PID 1's fds); a stale one by none.
    "$HOSTPY" - "$1" <<'PYEOF'
import os, stat, sys
pid = sys.argv[1]
tmp = f"/proc/{pid}/root/tmp"
files = {f"/tmp/{n}" for n in os.listdir(tmp) if stat.S_ISSOCK(os.lstat(f"{tmp}/{n}").st_mode)}
held = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:["):
        held.add(target[8:-1])
live = set()
with open(f"/proc/{pid}/net/unix") as f:
    next(f)
    for line in f:
        parts = line.split()
        if len(parts) >= 8 and parts[7] in files and int(parts[3], 16) & 0x10000 and parts[6] in held:
            live.add(parts[7])
print(len(files - live), len(live))
PYEOF
}
stop() { # stop NAME: SIGKILL to PID 1 (ends the namespace)
    local p u
    p=$(pid1 "$1")
    u=$(cat "$WORK/$1/unshare.pid")
    [ -z "$p" ] || kill -KILL "$p" 2>/dev/null
    wait "$u" 2>/dev/null
    return 0
}
exited_within() { # exited_within NAME SECONDS: sets RC to the exit status
    local u i
    u=$(cat "$WORK/$1/unshare.pid")
    for i in $(seq 1 $(($2 * 20))); do
        if grep -q '^State:.*Z' "/proc/$u/status" 2>/dev/null || [ ! -d "/proc/$u" ]; then
            wait "$u"
            RC=$?
            return 0
        fi
        sleep 0.05
    done
    return 1
}

echo "smoke: rootfs $ROOTFS ($(du -sh "$ROOTFS" | cut -f1)), scratch $WORK"

# --- run 1: cold start, ready file, process tree, SIGTERM, release, canary ----------
start run1 0 "" -- --served-model-name standin --enable-sleep-mode --port 8000
if cold=$(wait_ready run1); then
    pass "run1: ready file written (cold start ${cold} s)"
    ready_json=$(cat "$WORK/run1/ctl/ready.json")
    echo "smoke:      ready.json = $ready_json"
    check "run1: ready file is compact sorted JSON with the three oracle keys, mode 0600" \
        "$HOSTPY" -c 'import json,os,stat,sys; p=sys.argv[1]; raw=open(p).read(); d=json.loads(raw)
assert sorted(d)==["sampled_token_logprob","text","token_ids"], d
assert raw==json.dumps(d,sort_keys=True,separators=(",",":")), raw
assert stat.S_IMODE(os.stat(p).st_mode)==0o600' "$WORK/run1/ctl/ready.json"
    P1=$(pid1 run1)
    check "run1: the server is PID 1 of its namespace" grep -q "^NSpid:.*[[:space:]]1$" "/proc/$P1/status"
    check "run1: PID 1 catches no SIGTERM (SigCgt bit 15 clear)" \
        "$HOSTPY" -c 'import sys; cgt=[l for l in open(f"/proc/{sys.argv[1]}/status") if l.startswith("SigCgt")][0].split()[1]; sys.exit(1 if int(cgt,16) & (1<<14) else 0)' "$P1"
    check "run1: PID 1 fds 1 and 2 point at /dev/null after the ready file" \
        bash -c "[[ \$(readlink /proc/$P1/fd/1) == */dev/null && \$(readlink /proc/$P1/fd/2) == */dev/null ]]"
    CORE=""
    for c in $(cat /proc/"$P1"/task/*/children); do
        tr '\0' ' ' <"/proc/$c/cmdline" | grep -q 'spawn_main' && CORE=$c
    done
    check "run1: an EngineCore child started through multiprocessing spawn" test -n "$CORE"
    echo "smoke:      process tree:"
    for c in "$P1" $(cat /proc/"$P1"/task/*/children); do
        printf 'smoke:        %s (ns pid %s): %s\n' "$c" "$(awk '/^NSpid/{print $3}' /proc/$c/status)" "$(tr '\0' ' ' </proc/$c/cmdline | cut -c1-110)"
    done
    check "run1: the API process maps deleted POSIX semaphores from /dev/shm" \
        bash -c "grep -q '/dev/shm/sem\..* (deleted)' /proc/$P1/maps"
    check "run1: /dev/shm of the container still names the Queue's semaphores" \
        bash -c "nsenter -t $P1 -m ls -A $ROOTFS/dev/shm | grep -q '^sem\.mp-'"
    check "run1: EngineCore keeps ~/.triton/cache/<sha256>/cuda_utils.so mapped" \
        bash -c "grep -Eq '/root/\.triton/cache/[0-9a-f]{64}/cuda_utils\.so$' /proc/$CORE/maps"
    check "run1: EngineCore wrote weight-loading progress to stderr" grep -q 'Loading weights.bin shards: 100%' "$WORK/run1/stderr.log"
    zmq=$(zmq_sockets "$P1")
    echo "smoke:      ZMQ socket files in /tmp (stale live): $zmq"
    check "run1: /tmp holds the handshake's stale socket file and the live input and output sockets" \
        test "$zmq" = "1 2"
    check "run1: the EngineCore holds connected sockets to the input and output channels" \
        bash -c "[ \$(ls -l /proc/$CORE/fd | grep -c 'socket:') -ge 2 ]"
    if grep -q 'anon_inode:\[io_uring\]' < <(ls -l /proc/"$P1"/fd 2>/dev/null); then
        echo "smoke:      note: PID 1 holds an io_uring fd (the real uvloop's libuv)"
    fi
    kill -TERM "$P1"
    sleep 1
    check "run1: SIGTERM to PID 1 is ignored" alive run1
    PORT1=$(free_port)
    release run1 "{\"release\": true, \"port\": $PORT1, \"host\": \"127.0.0.1\"}"
    check "run1: listener up on the released port" wait_listen "$PORT1"
    c1=$(canary "$PORT1")
    echo "smoke:      canary = $c1"
    check "run1: HTTP canary matches the ready file's oracle" matches "$c1" "$(ready_oracle run1)"
    # The EngineCore's death is seen on its sentinel: 503, then the server exits 0.
    kill -KILL "$CORE"
    if exited_within run1 20; then
        check "run1: the EngineCore killed, the server exits 0 ($RC)" test "$RC" -eq 0
    else
        fail "run1: the EngineCore killed, the server exits"
        stop run1
    fi
else
    fail "run1: ready file written"
fi

# --- run 2: same model folder, as uid 1000, with an API key ---------------------------
# (no --enable-sleep-mode: server.py sets args.enable_sleep_mode itself)
start run2 1000 "" -- --served-model-name standin --api-key sekrit
if cold=$(wait_ready run2); then
    pass "run2 (uid 1000, --api-key): ready file written (cold start ${cold} s)"
    check "run2: same ready file as run1" cmp -s "$WORK/run1/ctl/ready.json" "$WORK/run2/ctl/ready.json"
    P2=$(pid1 run2)
    check "run2: the triton cache is under /home/engine" \
        bash -c "grep -q '/home/engine/\.triton/cache/' /proc/\$(cat /proc/$P2/task/*/children | tr ' ' '\n' | tail -n 1)/maps"
    PORT2=$(free_port)
    release run2 "{\"release\": true, \"port\": $PORT2, \"host\": \"127.0.0.1\", \"extra\": \"ignored\"}"
    wait_listen "$PORT2"
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT2/v1/models")
    check "run2: /v1/models without a key is 401 (got $code)" test "$code" = 401
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "http://127.0.0.1:$PORT2/v1/models")
    check "run2: /v1/models with a wrong key is 401 (got $code)" test "$code" = 401
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT2/health")
    check "run2: /health needs no key (got $code)" test "$code" = 200
    c2=$(canary "$PORT2" sekrit)
    check "run2: canary with the key is identical to run1's ($c2)" test "$c2" = "${c1:-none}"
    stop run2
else
    fail "run2: ready file written"
fi

# --- run 3: release false: exits without binding ---------------------------------------
start run3 0 "" -- --enable-sleep-mode --port 8000
if wait_ready run3 >/dev/null; then
    release run3 '{"release": false}'
    if exited_within run3 10; then
        check "run3: {\"release\": false} ends the server with a non-zero status ($RC)" test "$RC" -ne 0
    else
        fail "run3: {\"release\": false} ends the server"
        stop run3
    fi
    check "run3: nothing listens on port 8000" bash -c '! ss -ltn | grep -q ":8000 "'
else
    fail "run3: ready file written"
fi

# --- run 4: different weights give a different oracle; the asyncio uvloop ------------
mkdir -p "$WORK/model2"
cp "$ROOTFS/models/standin/config.json" "$ROOTFS/models/standin/weights.bin" "$WORK/model2/"
printf '\x01' | dd of="$WORK/model2/weights.bin" bs=1 seek=12345 conv=notrunc status=none
chmod -R a+rX "$WORK"
start run4 0 "$WORK/model2" PYTHONPATH=/opt/standin/asyncio-uvloop -- --enable-sleep-mode
if wait_ready run4 >/dev/null; then
    check "run4: one changed weight byte changes the oracle" bash -c "! cmp -s '$WORK/run1/ctl/ready.json' '$WORK/run4/ctl/ready.json'"
    P4=$(pid1 run4)
    check "run4: with the asyncio uvloop, PID 1 holds no io_uring fd" bash -c "! ls -l /proc/$P4/fd | grep -q io_uring"
    stop run4
else
    fail "run4: ready file written"
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
