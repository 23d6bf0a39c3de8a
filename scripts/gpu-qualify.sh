#!/usr/bin/env bash
# Qualifies a host for vsnap with real GPUs (see docs/gpu-hosts.md). Run as root.
#
# 1. Checks the prerequisites and says PASS / FAIL / SKIP for each: NVIDIA
#    driver (nvidia-smi, driver version, MIG, MPS), NVIDIA's cuda-checkpoint, CRIU
#    (>= 4.2.1, `criu check`) and its cuda_plugin.so, the io_uring sysctl, runc,
#    iptables-restore, containerd >= 2.0 and the vsnap shim.
# 2. Runs the snapshot flow under a PRIVATE containerd (its own root, state and
#    socket; the system's containerd is not touched): a cold start without a plan,
#    a create (cold start, capture with runc + CRIU, publish), then two restores from
#    the artifact AT ONCE, each copy's completions compared with the cold start's.
#    The tools reach runc and CRIU through the runtime config (criu_binary,
#    cuda_checkpoint, cuda_plugin_dir), as on a production node, not through PATH.
#    - Always with the project's reference engine (a CPU model, as scripts/demo.sh).
#    - With vLLM too when the host has a working GPU and both of these are set:
#        VSNAP_QUALIFY_IMAGE  a vLLM OpenAI server image: a fully qualified
#                             reference (pulled) or an image tarball (imported);
#                             its vLLM must support --snapshot-config
#        VSNAP_QUALIFY_MODEL  a model folder on this host (bind-mounted read-only
#                             at /model)
# 3. Prints a table of timings (cold start, create, checkpoint, each restore) and
#    artifact sizes, and lists every step it SKIPPED and why.
# Exit status 0 when everything it could run passed (skips allowed). There are no
# warnings: anything that would make a capture or restore fail later is a FAIL.
#
# Optional settings:
#   VSNAP_QUALIFY_GPU=0                 GPU index given to the vLLM container
#   VSNAP_QUALIFY_DEVICE                what `ctr run --device` gets (default: the CDI
#                                       device nvidia.com/gpu=<index>, when a CDI spec
#                                       in /etc/cdi or /var/run/cdi lists it)
#   VSNAP_QUALIFY_MIN_DRIVER=570        driver major needed (570: process trees;
#                                       555 suffices for a single CUDA process)
#   VSNAP_QUALIFY_VLLM_ARGS="--gpu-memory-utilization 0.4"
#                                       extra `vllm serve` arguments (the default
#                                       leaves room for two copies on one GPU)
#   VSNAP_QUALIFY_CTR_ARGS="..."        extra `ctr run` arguments for vLLM
#   VSNAP_QUALIFY_CAPTURE_TIMEOUT=1800  seconds for a vLLM cold start to capture-ready
#   VSNAP_QUALIFY_RESTORE_TIMEOUT=600   seconds for a vLLM restore to validate
#   VSNAP_QUALIFY_PLUGIN_DIR            CRIU's plugin folder (default: the libdir of
#                                       /etc/criu/runc.conf, else /usr/lib/criu)
#   VSNAP_QUALIFY_CUDA_CHECKPOINT, VSNAP_QUALIFY_NVIDIA_SMI, VSNAP_QUALIFY_CRIU,
#   VSNAP_QUALIFY_CONTAINERD            tool paths (default: found on PATH)
#   VSNAP_QUALIFY_SHIM, VSNAP_QUALIFY_ENGINE
#                                       prebuilt containerd-shim-vsnap-v1 and
#                                       vsnap-ref-engine (default: cargo build
#                                       --release from this checkout)
#   VSNAP_QUALIFY_WORKDIR=/var/tmp      where the private containerd and the
#                                       artifacts live (vLLM artifacts are GBs)
#   VSNAP_QUALIFY_KEEP=1                keep that folder (logs, artifacts) at the end
#   VSNAP_QUALIFY_REF_INIT_MS=3000, VSNAP_QUALIFY_REF_STATE_MB=256
#                                       the reference engine's simulated start-up
set -euo pipefail
cd "$(dirname "$0")/.."
TOP=$(pwd)
exec </dev/null
export LC_ALL=C
. scripts/lib.sh
vsnap_path

IMAGE=${VSNAP_QUALIFY_IMAGE:-}
MODEL=${VSNAP_QUALIFY_MODEL:-}
GPU_INDEX=${VSNAP_QUALIFY_GPU:-0}
MIN_DRIVER=${VSNAP_QUALIFY_MIN_DRIVER:-570}
CAPTURE_TIMEOUT=${VSNAP_QUALIFY_CAPTURE_TIMEOUT:-1800}
RESTORE_TIMEOUT=${VSNAP_QUALIFY_RESTORE_TIMEOUT:-600}
REF_INIT_MS=${VSNAP_QUALIFY_REF_INIT_MS:-3000}
REF_STATE_MB=${VSNAP_QUALIFY_REF_STATE_MB:-256}
WORKDIR=${VSNAP_QUALIFY_WORKDIR:-/var/tmp}
PROMPTS=("The capital of France is" "Write one sentence about fast restarts:" "1, 2, 3, 4, 5,")

FAILS=()
SKIPS=()
NPASS=0
say() { printf 'qualify: %s\n' "$*"; }
result() { # STATUS NAME DETAIL...
    local status=$1 name=$2
    shift 2
    printf 'qualify: [%-4s] %-18s %s\n' "$status" "$name" "$*"
    case $status in
    PASS) NPASS=$((NPASS + 1)) ;;
    FAIL) FAILS+=("$name: $*") ;;
    SKIP) SKIPS+=("$name: $*") ;;
    esac
}
# version_ge A B: A >= B (dotted versions)
version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]; }
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }

[ "$(id -u)" -eq 0 ] || { echo "qualify: must run as root (containers, mounts, CRIU)" >&2; exit 1; }
say "vsnap GPU host qualification on $(uname -n), kernel $(uname -r), $(date -u +%Y-%m-%dT%H:%M:%SZ)"

# =======================================================================================
say "1. prerequisites"

# --- NVIDIA driver -----------------------------------------------------------------------
GPU=0
GPU_WHY=
NVSMI=${VSNAP_QUALIFY_NVIDIA_SMI:-$(command -v nvidia-smi || true)}
if [ -z "$NVSMI" ]; then
    GPU_WHY="no GPU on this host (no nvidia-smi)"
    result SKIP "gpu checks" "nvidia-smi, driver version, MIG, MPS: nvidia-smi is not on PATH (no NVIDIA driver on this host)"
elif ! smi_out=$(timeout 60 "$NVSMI" --query-gpu=name,uuid,driver_version --format=csv,noheader 2>&1); then
    GPU_WHY="nvidia-smi fails"
    result FAIL nvidia-smi "$NVSMI fails: $(printf '%s' "$smi_out" | tail -n 1)"
elif ! grep -q 'GPU-' <<<"$smi_out"; then
    GPU_WHY="no GPU on this host (nvidia-smi lists none)"
    result SKIP "gpu checks" "driver version, MIG, MPS: $NVSMI lists no GPU: $(printf '%s' "$smi_out" | tail -n 1)"
else
    GPU=1
    ngpu=$(grep -c 'GPU-' <<<"$smi_out")
    result PASS nvidia-smi "$ngpu GPU(s):"
    grep 'GPU-' <<<"$smi_out" | sed 's/^/qualify:          /'
    driver=$(grep 'GPU-' <<<"$smi_out" | head -n 1 | awk -F', *' '{print $NF}')
    major=${driver%%.*}
    if ! [[ "$major" =~ ^[0-9]+$ ]]; then
        result FAIL driver "cannot read the driver version from nvidia-smi: '$driver'"
    elif [ "$major" -ge "$MIN_DRIVER" ]; then
        result PASS driver "$driver (>= $MIN_DRIVER)"
    else
        result FAIL driver "NVIDIA driver $driver is older than $MIN_DRIVER (cuda-checkpoint needs >= 555; process trees such as vLLM with worker processes need >= 570)"
    fi
    mig=$(timeout 60 "$NVSMI" --query-gpu=index,mig.mode.current --format=csv,noheader 2>/dev/null || true)
    if grep -qi 'enabled' <<<"$mig"; then
        result FAIL mig "MIG is enabled ($(grep -i enabled <<<"$mig" | tr '\n' ' ')): cuda-checkpoint does not support MIG; disable it (nvidia-smi -i N -mig 0)"
    else
        result PASS mig "MIG is not enabled"
    fi
    if pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1; then
        result FAIL mps "an MPS control daemon runs: cuda-checkpoint does not support MPS clients; stop it (echo quit | nvidia-cuda-mps-control) before qualifying"
    else
        result PASS mps "no MPS control daemon"
    fi
fi

# --- cuda-checkpoint ----------------------------------------------------------------------
CUDA_CHECKPOINT=${VSNAP_QUALIFY_CUDA_CHECKPOINT:-$(command -v cuda-checkpoint || true)}
if [ -n "$CUDA_CHECKPOINT" ] && [ -f "$CUDA_CHECKPOINT" ] && [ -x "$CUDA_CHECKPOINT" ]; then
    result PASS cuda-checkpoint "$CUDA_CHECKPOINT"
elif [ "$GPU" -eq 1 ]; then
    result FAIL cuda-checkpoint "cuda-checkpoint not found at ${CUDA_CHECKPOINT:-any folder of PATH ($PATH)}: install NVIDIA's cuda-checkpoint binary (e.g. /usr/local/bin/cuda-checkpoint); CRIU's CUDA plugin runs it from PATH"
else
    result SKIP cuda-checkpoint "not installed; only needed with a GPU: $GPU_WHY"
fi

# --- CRIU ---------------------------------------------------------------------------------
CRIU=${VSNAP_QUALIFY_CRIU:-$(command -v criu || true)}
if [ -z "$CRIU" ]; then
    result FAIL criu "criu not found on PATH: run scripts/setup.sh (installs CRIU 4.2 at /usr/local/sbin/criu)"
else
    criu_version=$("$CRIU" --version 2>/dev/null | awk '/^Version:/{print $2; exit}')
    if [ -z "$criu_version" ]; then
        result FAIL criu "$CRIU --version reports no version"
    elif version_ge "$criu_version" 4.2.1; then
        result PASS criu "$criu_version at $CRIU"
    else
        result FAIL criu "$CRIU is $criu_version; vsnap needs CRIU >= 4.2.1 (scripts/setup.sh builds it)"
    fi
    if check_out=$("$CRIU" check 2>&1); then
        result PASS "criu check" "$(printf '%s' "$check_out" | tail -n 1)"
    else
        result FAIL "criu check" "$(printf '%s' "$check_out" | tail -n 1)"
    fi
fi

# --- CRIU's CUDA plugin -------------------------------------------------------------------
PLUGIN_DIR=${VSNAP_QUALIFY_PLUGIN_DIR:-}
plugin_origin="VSNAP_QUALIFY_PLUGIN_DIR"
if [ -z "$PLUGIN_DIR" ] && [ -r /etc/criu/runc.conf ]; then
    PLUGIN_DIR=$(awk '$1 == "libdir" || $1 == "--libdir" || $1 == "-L" {print $2; exit}' /etc/criu/runc.conf)
    plugin_origin="libdir in /etc/criu/runc.conf"
fi
if [ -z "$PLUGIN_DIR" ]; then
    PLUGIN_DIR=/usr/lib/criu
    plugin_origin="CRIU's default plugin folder"
fi
if [ -f "$PLUGIN_DIR/cuda_plugin.so" ]; then
    result PASS cuda_plugin.so "$PLUGIN_DIR/cuda_plugin.so ($plugin_origin)"
elif [ "$GPU" -eq 1 ]; then
    result FAIL cuda_plugin.so "CUDA plugin not found: $PLUGIN_DIR/cuda_plugin.so does not exist ($plugin_origin); scripts/setup.sh builds it (make cuda_plugin)"
else
    result SKIP cuda_plugin.so "$PLUGIN_DIR/cuda_plugin.so missing; only needed with a GPU: $GPU_WHY"
fi

# --- io_uring -----------------------------------------------------------------------------
if uring=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null); then
    if [ "$uring" = 2 ]; then
        result PASS io_uring "kernel.io_uring_disabled=2 (no process can create io_uring instances)"
    else
        result FAIL io_uring "kernel.io_uring_disabled=$uring: root containers can still create io_uring instances, which CRIU cannot dump (the capture then fails naming the pid); for vLLM set: sysctl -w kernel.io_uring_disabled=2"
    fi
else
    result FAIL io_uring "this kernel has no kernel.io_uring_disabled sysctl: an engine that opens io_uring cannot be captured (Linux >= 6.6 has it)"
fi

# --- runc, iptables, containerd, the shim ---------------------------------------------------
if command -v runc >/dev/null 2>&1; then
    result PASS runc "$(runc --version | head -n 1) at $(command -v runc)"
else
    result FAIL runc "runc not found on PATH: run scripts/setup.sh"
fi
if command -v iptables-restore >/dev/null 2>&1; then
    result PASS iptables "$(command -v iptables-restore) (CRIU's network lock needs it)"
else
    result FAIL iptables "iptables-restore not found: CRIU's network lock needs it (apt-get install iptables)"
fi
CONTAINERD=${VSNAP_QUALIFY_CONTAINERD:-}
if [ -z "$CONTAINERD" ]; then
    if [ -x /opt/vsnap/containerd/bin/containerd ]; then
        CONTAINERD=/opt/vsnap/containerd/bin/containerd
    else
        CONTAINERD=$(command -v containerd || true)
    fi
fi
CTR_BIN=
if [ -z "$CONTAINERD" ]; then
    result FAIL containerd "containerd not found (neither /opt/vsnap/containerd/bin nor PATH): run scripts/setup.sh"
else
    cv=$("$CONTAINERD" --version 2>/dev/null | awk '{print $3}' | sed 's/^v//; s/[+~-].*//')
    CTR_BIN="$(dirname "$CONTAINERD")/ctr"
    [ -x "$CTR_BIN" ] || CTR_BIN=$(command -v ctr || true)
    if [ -z "$cv" ] || ! version_ge "$cv" 2.0.0; then
        result FAIL containerd "$CONTAINERD is version '${cv:-unknown}'; the shim needs containerd >= 2.0 (task API v3)"
    elif [ -z "$CTR_BIN" ]; then
        result FAIL containerd "ctr not found beside $CONTAINERD nor on PATH"
    else
        result PASS containerd "$cv at $CONTAINERD"
    fi
fi
SHIM=${VSNAP_QUALIFY_SHIM:-}
ENGINE=${VSNAP_QUALIFY_ENGINE:-}
if [ -z "$SHIM" ] || [ -z "$ENGINE" ]; then
    if command -v cargo >/dev/null 2>&1; then
        say "building containerd-shim-vsnap-v1 and vsnap-ref-engine (cargo build --release)"
        if build_out=$(cargo build --release -p vsnap-shim -p vsnap-ref-engine -p vsnap-oci-hooks 2>&1); then
            target=${CARGO_TARGET_DIR:-$TOP/target}
            SHIM=${SHIM:-$target/release/containerd-shim-vsnap-v1}
            ENGINE=${ENGINE:-$target/release/vsnap-ref-engine}
        else
            printf '%s\n' "$build_out" | tail -n 20 | sed 's/^/qualify:   /'
            result FAIL shim "cargo build --release failed in $TOP (or set VSNAP_QUALIFY_SHIM and VSNAP_QUALIFY_ENGINE)"
        fi
    else
        SHIM=${SHIM:-$(command -v containerd-shim-vsnap-v1 || true)}
        ENGINE=${ENGINE:-$(command -v vsnap-ref-engine || true)}
    fi
fi
if [ -n "$SHIM" ] && [ -x "$SHIM" ]; then
    result PASS shim "$SHIM"
else
    result FAIL shim "containerd-shim-vsnap-v1 not found (no cargo to build it, not on PATH; or set VSNAP_QUALIFY_SHIM)"
    SHIM=
fi
if [ -n "$ENGINE" ] && [ -x "$ENGINE" ]; then
    result PASS ref-engine "$ENGINE"
else
    result FAIL ref-engine "vsnap-ref-engine not found (or set VSNAP_QUALIFY_ENGINE)"
    ENGINE=
fi
for tool in curl python3 busybox; do
    if command -v "$tool" >/dev/null 2>&1; then
        result PASS "$tool" "$(command -v "$tool")"
    else
        result FAIL "$tool" "$tool not found on PATH (the flow needs it)"
    fi
done

# --- can vLLM run? -------------------------------------------------------------------------
VLLM=0
VLLM_WHY=
DEVICE_ARGS=()
if [ "$GPU" -ne 1 ]; then
    VLLM_WHY="$GPU_WHY; the reference engine ran the same flow instead"
elif [ -z "$IMAGE" ] || [ -z "$MODEL" ]; then
    VLLM_WHY="VSNAP_QUALIFY_IMAGE and VSNAP_QUALIFY_MODEL are not both set"
elif [ ! -d "$MODEL" ]; then
    result FAIL model "VSNAP_QUALIFY_MODEL=$MODEL is not a folder"
    VLLM_WHY="the model folder is missing"
elif [ "${#FAILS[@]}" -gt 0 ]; then
    VLLM_WHY="prerequisite checks failed"
else
    cdi=$(grep -ls 'nvidia.com/gpu' /etc/cdi/* /var/run/cdi/* 2>/dev/null | head -n 1 || true)
    if [ -n "${VSNAP_QUALIFY_DEVICE:-}" ]; then
        DEVICE_ARGS=(--device "$VSNAP_QUALIFY_DEVICE")
        result PASS gpu-injection "ctr run --device $VSNAP_QUALIFY_DEVICE (VSNAP_QUALIFY_DEVICE)"
        VLLM=1
    elif [ -n "$cdi" ]; then
        DEVICE_ARGS=(--device "nvidia.com/gpu=$GPU_INDEX")
        result PASS gpu-injection "CDI spec $cdi: ctr run --device nvidia.com/gpu=$GPU_INDEX"
        VLLM=1
    elif command -v nvidia-container-cli >/dev/null 2>&1; then
        # vsnap refuses GPUs given by an OCI hook (ctr --gpus): CRIU does not
        # know what it mounts and runc would run it again at restore.
        result FAIL gpu-injection "no CDI spec, only nvidia-container-cli (ctr --gpus, a prestart hook vsnap refuses for snapshots): generate one with nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
        VLLM_WHY="no CDI spec for the GPU"
    else
        result FAIL gpu-injection "no way to give a container the GPU: no CDI spec in /etc/cdi or /var/run/cdi and no nvidia-container-cli; install the NVIDIA Container Toolkit and run: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
        VLLM_WHY="no CDI spec for the GPU"
    fi
fi

# =======================================================================================
CAN_FLOW=1
for need in "$SHIM" "$ENGINE" "$CTR_BIN" "$CONTAINERD" "$CRIU"; do [ -n "$need" ] || CAN_FLOW=0; done
for tool in curl python3 busybox runc; do command -v "$tool" >/dev/null 2>&1 || CAN_FLOW=0; done

D=
CPID=
ROWS=()
declare -A ATTACH=()
cleanup() {
    set +e
    if [ -n "$D" ] && [ -n "$CPID" ]; then
        for t in $(ctr_ task ls -q 2>/dev/null); do ctr_ task kill -s SIGKILL "$t" >/dev/null 2>&1; done
        sleep 0.5
        for t in $(ctr_ task ls -q 2>/dev/null); do ctr_ task delete "$t" >/dev/null 2>&1; done
        for c in $(ctr_ c ls -q 2>/dev/null); do ctr_ c rm "$c" >/dev/null 2>&1; done
        for id in "${!ATTACH[@]}"; do stop_attach "$id"; done
        kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null
    fi
    if [ -n "$D" ]; then
        # Anything still mounted under the work folder (a snapshot left by a failure).
        findmnt -rn -o TARGET | grep -F "$D/" | sort -r | while read -r m; do umount -l "$m"; done
        if [ "${VSNAP_QUALIFY_KEEP:-0}" = 1 ]; then
            say "kept $D (logs, artifacts)"
        else
            rm -rf "$D"
        fi
    fi
}
trap cleanup EXIT
ctr_() { "$CTR_BIN" --address "$D/state/containerd.sock" "$@"; }

start_containerd() {
    D=$(mktemp -d "$WORKDIR/vsnap-qualify.XXXXXX")
    mkdir -p "$D/bin" "$D/logs"
    ln -s "$SHIM" "$D/bin/containerd-shim-vsnap-v1"
    vsnap_containerd_config "$D" >"$D/config.toml"
    # The tools as an operator configures them: the shim gives runc and CRIU
    # these paths (--criu, PATH for the CUDA plugin's cuda-checkpoint, libdir),
    # so nothing here relies on containerd's own PATH holding them.
    {
        printf 'artifact_root = "%s"\n' "$D/artifacts"
        printf 'criu_binary = "%s"\n' "$CRIU"
        printf 'cuda_plugin_dir = "%s"\n' "$PLUGIN_DIR"
        [ -n "$CUDA_CHECKPOINT" ] && printf 'cuda_checkpoint = "%s"\n' "$(readlink -f "$CUDA_CHECKPOINT")"
    } >"$D/vsnap.toml"
    PATH="$D/bin:$(dirname "$CONTAINERD"):$PATH" "$CONTAINERD" --config "$D/config.toml" >"$D/containerd.log" 2>&1 &
    CPID=$!
    for _ in $(seq 100); do ctr_ version >/dev/null 2>&1 && return 0; sleep 0.1; done
    say "containerd did not come up; its log:"
    tail -n 20 "$D/containerd.log" | sed 's/^/qualify:   /'
    return 1
}

# The reference engine's rootfs, as the tests and benchmarks make it (scripts/lib.sh),
# with the busybox found on PATH.
make_ref_rootfs() {
    VSNAP_BUSYBOX=$(command -v busybox) vsnap_engine_rootfs "$D/rootfs" "$ENGINE"
}

# run_engine KIND ID PORT [PLAN]: starts a container detached; with a plan, ctr
# returns for a restore only once the copy validated its canary and listens.
run_engine() {
    local kind=$1 id=$2 port=$3 plan=${4:-} ann=() listen
    # Without a plan the engine listens where its arguments say. Under a plan it
    # listens where vsnap.io/listen says, and the argv stays the same for the create
    # and every restore (argv is part of the artifact's identity).
    listen=(--host 127.0.0.1 --port "$port")
    if [ -n "$plan" ]; then
        listen=()
        ann=(--annotation "vsnap.io/plan=$plan" --annotation "vsnap.io/artifact=qualify-$kind"
            --annotation "vsnap.io/listen=127.0.0.1:$port" --annotation vsnap.io/after-capture=exit)
        [ "$kind" = vllm ] && ann+=(--annotation "vsnap.io/capture-timeout=$CAPTURE_TIMEOUT"
            --annotation "vsnap.io/activation-timeout=$RESTORE_TIMEOUT")
    fi
    local common=(run -d --net-host --runtime io.vsnap.v1 --runtime-config-path "$D/vsnap.toml" "${ann[@]}")
    if [ "$kind" = ref ]; then
        ctr_ "${common[@]}" --env "VSNAP_ENGINE_INIT_MS=$REF_INIT_MS" --env "VSNAP_ENGINE_STATE_MB=$REF_STATE_MB" \
            --rootfs "$D/rootfs" "$id" /vsnap-ref-engine --served-model-name qualify \
            "${listen[@]}" >>"$D/logs/ctr.log" 2>&1
    else
        # Under a plan the shim appends --snapshot-config to a `vllm serve` argv.
        # shellcheck disable=SC2086
        ctr_ "${common[@]}" "${DEVICE_ARGS[@]}" ${VSNAP_QUALIFY_CTR_ARGS:-} \
            --mount "type=bind,src=$MODEL,dst=/model,options=rbind:ro" \
            --env VLLM_WORKER_MULTIPROC_METHOD=spawn --env NCCL_IB_DISABLE=1 \
            --env HF_HUB_OFFLINE=1 --env TRANSFORMERS_OFFLINE=1 --env VLLM_NO_USAGE_STATS=1 \
            "$IMAGE_REF" "$id" vllm serve /model --served-model-name qualify "${listen[@]}" \
            ${VSNAP_QUALIFY_VLLM_ARGS:---gpu-memory-utilization 0.4} >>"$D/logs/ctr.log" 2>&1
    fi || return 1
    [ -n "${NO_ATTACH:-}" ] && return 0
    # Drain the engine's output into a log (a detached task whose output nobody
    # reads stalls once the pipe buffers are full).
    ctr_ task attach "$id" >"$D/logs/$id.log" 2>&1 &
    ATTACH[$id]=$!
}

task_status() { ctr_ task ls 2>/dev/null | awk -v id="$1" '$1 == id {print $3}'; }

stop() {
    ctr_ task kill -s SIGKILL "$1" >/dev/null 2>&1 || true
    for _ in $(seq 100); do [ "$(task_status "$1")" = RUNNING ] || break; sleep 0.1; done
    ctr_ task delete "$1" >/dev/null 2>&1 || true
    ctr_ c rm "$1" >/dev/null 2>&1 || true
    stop_attach "$1"
}
stop_attach() {
    local pid=${ATTACH[$1]:-}
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "ATTACH[$1]"
}

# wait_ready ID PORT SECONDS: the engine answers /health (or the task died).
wait_ready() {
    local deadline=$(($(date +%s) + $3))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$2/health" && return 0
        [ "$(task_status "$1")" = RUNNING ] || return 1
        sleep 0.1
    done
    return 1
}

# answers PORT OUT: the greedy completions of the prompts (text and token ids only:
# ids, timestamps and logprobs may differ between processes).
answers() {
    local p body
    : >"$2"
    for p in "${PROMPTS[@]}"; do
        body=$(python3 -c 'import json, sys; print(json.dumps({"model": "qualify", "prompt": sys.argv[1], "max_tokens": 16, "temperature": 0, "seed": 0, "return_token_ids": True}))' "$p")
        curl -s --max-time 300 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' -d "$body" |
            python3 -c 'import json, sys; r = json.load(sys.stdin); print(json.dumps([[c.get("text"), c.get("token_ids")] for c in r["choices"]]))' \
                >>"$2" || return 1
    done
}

diagnose() { # ID
    local id=$1 f
    say "  diagnostics for $id:"
    f=$(find "$D/state" -path "*/$id/vsnap-error.json" 2>/dev/null | head -n 1)
    [ -n "$f" ] && sed 's/^/qualify:     vsnap-error.json: /' "$f" && echo
    [ -s "$D/logs/$id.log" ] && tail -n 15 "$D/logs/$id.log" | sed 's/^/qualify:     output: /'
    grep -F "$id" "$D/containerd.log" | tail -n 8 | sed 's/^/qualify:     containerd: /'
    tail -n 5 "$D/logs/ctr.log" 2>/dev/null | sed 's/^/qualify:     ctr: /'
}

# flow KIND: cold start, create, two restores; appends a row to ROWS.
flow() {
    local kind=$1 ready_s=60 base=18200 art t cold create ckpt size verdict i p phases restores=()
    [ "$kind" = ref ] && base=18100
    [ "$kind" = vllm ] && ready_s=$CAPTURE_TIMEOUT
    art="$D/artifacts/qualify-$kind"
    for p in $(seq "$base" "$((base + 3))"); do
        if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$p/"; then
            say "  port $p is already in use on this host: stop what listens there"
            return 1
        fi
    done

    say "  cold start without a plan"
    t=$(now)
    run_engine "$kind" "$kind-cold" "$base" || { diagnose "$kind-cold"; return 1; }
    wait_ready "$kind-cold" "$base" "$ready_s" || { say "  the cold start never became ready"; diagnose "$kind-cold"; return 1; }
    cold=$(since "$t")
    answers "$base" "$D/$kind-cold.answers" || { say "  the cold start did not answer"; diagnose "$kind-cold"; return 1; }
    stop "$kind-cold"
    say "    ready in $cold s"

    say "  create: cold start privately, capture with runc + CRIU, publish (after-capture=exit)"
    t=$(now)
    run_engine "$kind" "$kind-donor" "$((base + 1))" create || { diagnose "$kind-donor"; return 1; }
    local deadline=$(($(date +%s) + ready_s + 600))
    while [ ! -f "$art/manifest.json" ]; do
        if [ "$(task_status "$kind-donor")" != RUNNING ] || [ "$(date +%s)" -ge "$deadline" ]; then
            sleep 1
            [ -f "$art/manifest.json" ] && break
            say "  no artifact was published"
            diagnose "$kind-donor"
            return 1
        fi
        sleep 0.05
    done
    create=$(since "$t")
    stop "$kind-donor"
    ckpt=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print("%.2f" % (m["timings_ms"]["checkpoint"] / 1000))' "$art/manifest.json" 2>/dev/null || echo "?")
    size=$(du -sh "$art" | cut -f1)
    say "    published in $create s (checkpoint $ckpt s, artifact $size)"

    verdict=match
    # Two copies restored at once from the one artifact (on one GPU for vLLM:
    # the donor exited, so its GPU memory is free for them).
    say "  restore copy1 and copy2 at the same time"
    local waiting=()
    for i in 1 2; do
        (
            t=$(now)
            NO_ATTACH=1 run_engine "$kind" "$kind-copy$i" "$((base + 1 + i))" restore && since "$t" >"$D/$kind-copy$i.took"
        ) &
        waiting+=($!)
    done
    wait "${waiting[@]}" || true
    for i in 1 2; do
        if [ ! -s "$D/$kind-copy$i.took" ]; then
            say "  the restore of copy$i failed"
            diagnose "$kind-copy$i"
            return 1
        fi
        restores+=("$(cat "$D/$kind-copy$i.took")")
        # The subshell's output drain is gone with it: drain here.
        ctr_ task attach "$kind-copy$i" >"$D/logs/$kind-copy$i.log" 2>&1 &
        ATTACH[$kind-copy$i]=$!
    done
    for i in 1 2; do
        answers "$((base + 1 + i))" "$D/$kind-copy$i.answers" || { say "  copy$i did not answer"; diagnose "$kind-copy$i"; return 1; }
        phases=$(find "$D/state" -path "*/$kind-copy$i/vsnap-restore.json" 2>/dev/null | head -n 1)
        [ -n "$phases" ] && phases=$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); print(", ".join("%s %.2f s" % (k[:-3].replace("_", " "), t[k] / 1000) for k in ("preflight_ms", "verify_ms", "criu_restore_ms", "activation_ms", "listener_ms") if k in t))' "$phases" 2>/dev/null || true)
        say "    copy$i validated and listening in ${restores[$((i - 1))]} s${phases:+ ($phases)}"
        if cmp -s "$D/$kind-cold.answers" "$D/$kind-copy$i.answers"; then
            say "    ${#PROMPTS[@]} completions identical to the cold start"
        else
            verdict=DIFFER
            say "    copy$i answered differently from the cold start:"
            diff "$D/$kind-cold.answers" "$D/$kind-copy$i.answers" | sed 's/^/qualify:      /'
        fi
        stop "$kind-copy$i"
    done
    ROWS+=("$(printf '%-10s %10s %10s %11s %10s %10s %9s  %s' "$kind" "$cold" "$create" "$ckpt" "${restores[0]}" "${restores[1]}" "$size" "$verdict")")
    [ "$verdict" = match ]
}

say "2. snapshot flow under a private containerd"
if [ "$CAN_FLOW" -ne 1 ]; then
    result SKIP flow "the flow needs containerd, ctr, runc, CRIU, the shim, the reference engine, curl, python3 and busybox (see the FAILs above)"
elif ! start_containerd; then
    result FAIL flow "the private containerd did not start"
else
    say "private containerd in $D"
    say "reference engine (CPU; init ${REF_INIT_MS} ms, ${REF_STATE_MB} MiB of state)"
    make_ref_rootfs
    if flow ref; then
        result PASS "ref flow" "create + 2 restores; copies answer like the cold start"
    else
        result FAIL "ref flow" "see the messages above"
    fi
    if [ "$VLLM" -eq 1 ]; then
        say "vLLM on GPU $GPU_INDEX: image $IMAGE, model $MODEL"
        IMAGE_REF=
        if [ -f "$IMAGE" ]; then
            if ctr_ images import "$IMAGE" >"$D/logs/image.log" 2>&1; then
                IMAGE_REF=$(ctr_ images ls -q | head -n 1)
            fi
        elif ctr_ images pull "$IMAGE" >"$D/logs/image.log" 2>&1; then
            IMAGE_REF=$IMAGE
        fi
        if [ -z "$IMAGE_REF" ]; then
            tail -n 5 "$D/logs/image.log" | sed 's/^/qualify:   /'
            result FAIL "vllm flow" "could not import or pull $IMAGE (a pull needs the fully qualified reference)"
        elif flow vllm; then
            result PASS "vllm flow" "create + 2 restores on the GPU; copies answer like the cold start"
        else
            result FAIL "vllm flow" "see the messages above"
        fi
    else
        result SKIP "vllm flow" "$VLLM_WHY"
    fi
fi

# =======================================================================================
say "3. results"
if [ "${#ROWS[@]}" -gt 0 ]; then
    say "$(printf '%-10s %10s %10s %11s %10s %10s %9s  %s' engine "cold (s)" "create (s)" "ckpt (s)" "copy1 (s)" "copy2 (s)" artifact answers)"
    for row in "${ROWS[@]}"; do say "$row"; done
    say "cold: start to /health; create: start to the artifact published (cold start + capture);"
    say "ckpt: runc checkpoint alone (manifest); copyN: ctr run until the restored copy validated and listens"
fi
for s in "${SKIPS[@]}"; do say "SKIPPED $s"; done
for f in "${FAILS[@]}"; do say "FAILED  $f"; done
say "$NPASS passed, ${#SKIPS[@]} skipped, ${#FAILS[@]} failed"
if [ "${#FAILS[@]}" -gt 0 ]; then
    say "NOT QUALIFIED"
    exit 1
fi
say "everything that could run here passed"
