#!/usr/bin/env bash
# `scripts/bench.sh shim` (the default of scripts/bench.sh), or run directly.
#
# Side-by-side benchmark of the vsnap shim (io.vsnap.v1) against containerd's Go
# runc shim (io.containerd.runc.v2), both served by ONE private containerd (its own
# root, state and socket) in the same run, both driving the same runc (/usr/sbin/runc):
#
#   1. wall time of `ctr run --rm --rootfs DIR ID /bin/true`: BENCH_RUNS paired runs
#      (default 30) after BENCH_WARMUP unmeasured runs of each (default 2), the order
#      within each pair alternating (vsnap,runc / runc,vsnap / ...: ABBA) so that slow
#      drift of a shared machine falls on both; median, p10, p90, ratio of medians;
#   2. memory of one idle shim process serving a container that runs `sleep 1000`:
#      VmRSS, RssAnon, threads (/proc/PID/status), Pss and USS (/proc/PID/smaps_rollup).
#
# Progress goes to stderr; the results (a markdown report) go to stdout and, when
# BENCH_OUT is set, to that file too. Installs what it needs first (scripts/setup.sh,
# idempotent) and builds the release shim only if it is missing or older than its
# sources. Everything it starts (tasks, containers, shims, containerd, temp dir) is
# cleaned up on exit, also on failure. Run as root.
#
# Environment:
#   BENCH_RUNS=30           paired runs of the /bin/true benchmark
#   BENCH_WARMUP=2          unmeasured runs of each runtime before them
#   BENCH_OUT=FILE          also write the report to FILE
#   BENCH_SHIM=PATH         the vsnap shim binary (default release/containerd-shim-vsnap-v1
#                           of CARGO_TARGET_DIR, else of ./target)
#   BENCH_AGAINST=PATH      time this other vsnap shim binary (the build before a change, say)
#                           in place of the Go shim, as runtime io.vsnapb.v1 in the same
#                           containerd: the ratio is then BENCH_SHIM / BENCH_AGAINST
#   BENCH_LOG_LEVEL=info    containerd's log level (debug: timestamps of every shim call)
#   BENCH_CONTAINERD_LOG=F  keep a copy of containerd's log in F
set -euo pipefail
cd "$(dirname "$0")/../.."
exec </dev/null
export LC_ALL=C
[ "$(id -u)" -eq 0 ] || { echo "bench: must run as root" >&2; exit 1; }

RUNS=${BENCH_RUNS:-30}
WARMUP=${BENCH_WARMUP:-2}
LOG_LEVEL=${BENCH_LOG_LEVEL:-info}
case "$RUNS" in '' | *[!0-9]*) echo "bench: BENCH_RUNS must be a positive integer" >&2; exit 1 ;; esac
case "$WARMUP" in '' | *[!0-9]*) echo "bench: BENCH_WARMUP must be an integer" >&2; exit 1 ;; esac
[ "$RUNS" -ge 1 ] || { echo "bench: BENCH_RUNS must be >= 1" >&2; exit 1; }

say() { printf 'bench: %s\n' "$*" >&2; }

./scripts/setup.sh >&2
. scripts/lib.sh
vsnap_path

CBIN=/opt/vsnap/containerd/bin
RUNC=/usr/sbin/runc
SHIM_NAME=containerd-shim-vsnap-v1
GO_SHIM_NAME=containerd-shim-runc-v2
[ -x "$RUNC" ] || { echo "bench: $RUNC missing (scripts/setup.sh installs it)" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "bench: /bin/busybox missing (busybox-static)" >&2; exit 1; }

# --- the vsnap shim: release build, rebuilt only when stale -----------------------------
if [ -n "${BENCH_SHIM:-}" ]; then
    SHIM=$(readlink -f "$BENCH_SHIM")
    [ -x "$SHIM" ] || { echo "bench: BENCH_SHIM=$BENCH_SHIM is not an executable" >&2; exit 1; }
else
    SHIM="$(vsnap_target_dir)/release/$SHIM_NAME"
    if [ ! -x "$SHIM" ] || [ -n "$(find shim/src shim/Cargo.toml config/src config/Cargo.toml Cargo.lock \
        -newer "$SHIM" -print -quit 2>/dev/null)" ]; then
        say "building the release shim (cargo build --release -p vsnap-shim)"
        cargo build --release -p vsnap-shim >&2
    fi
    [ -x "$SHIM" ] || { echo "bench: $SHIM was not built" >&2; exit 1; }
fi

AGAINST=
if [ -n "${BENCH_AGAINST:-}" ]; then
    AGAINST=$(readlink -f "$BENCH_AGAINST")
    [ -x "$AGAINST" ] || { echo "bench: BENCH_AGAINST=$BENCH_AGAINST is not an executable" >&2; exit 1; }
fi

# --- a private containerd ---------------------------------------------------------------
D=$(mktemp -d /tmp/vsnap-bench.XXXXXX)
SOCK="$D/state/containerd.sock"
CTR=("$CBIN/ctr" --address "$SOCK")
CPID=
cleanup() {
    local rc=$? t c p m r
    set +e
    trap - EXIT INT TERM
    if [ -n "$CPID" ] && kill -0 "$CPID" 2>/dev/null; then
        vsnap_stop_containerd "$CPID" "${CTR[@]}"
    fi
    # Shims of this containerd that outlived it (only ours: their -address is our socket).
    for p in $(procs_with "" "" " -address $SOCK "); do kill -KILL "$p" 2>/dev/null; done
    # Containers of this run that runc still knows (only if containerd could not delete them).
    for r in /run/containerd/runc/default "$D/state/vsnap-runc/default"; do
        [ -d "$r" ] || continue
        for c in $("$RUNC" --root "$r" list -q 2>/dev/null); do
            case "$c" in bench-*-"$$" | bench-*-"$$"-*) "$RUNC" --root "$r" delete --force "$c" 2>/dev/null ;; esac
        done
    done
    if [ "$rc" -ne 0 ] && [ -f "$D/containerd.log" ]; then
        echo "bench: FAILED (exit $rc); last lines of containerd's log:" >&2
        tail -n 30 "$D/containerd.log" >&2
    fi
    if [ -n "${BENCH_CONTAINERD_LOG:-}" ] && [ -f "$D/containerd.log" ]; then
        cp "$D/containerd.log" "$BENCH_CONTAINERD_LOG"
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

# PIDs of the processes whose argv[0] has the basename $1 (or $2; empty: any) and whose
# arguments, joined by spaces and framed by spaces, contain $3. No process is spawned
# per /proc entry (mapfile is a builtin), so the scan never matches itself.
procs_with() {
    local f p line argv=()
    for f in /proc/[0-9]*/cmdline; do
        p=${f#/proc/}
        p=${p%/cmdline}
        mapfile -d '' -t argv 2>/dev/null <"$f" || continue
        [ "${#argv[@]}" -gt 0 ] || continue
        if [ -n "$1" ] && [ "${argv[0]##*/}" != "$1" ] && [ "${argv[0]##*/}" != "$2" ]; then continue; fi
        line=" ${argv[*]} "
        [[ $line == *"$3"* ]] && echo "$p"
    done
    return 0
}

mkdir -p "$D/bin"
ln -s "$SHIM" "$D/bin/$SHIM_NAME"
[ -z "$AGAINST" ] || ln -s "$AGAINST" "$D/bin/containerd-shim-vsnapb-v1"
vsnap_busybox_rootfs "$D/rootfs"
vsnap_containerd_config "$D" "$LOG_LEVEL" >"$D/config.toml"
# Both shims are told to use $RUNC explicitly; their PATH resolves runc to it as well.
printf 'runc_binary = "%s"\n' "$RUNC" >"$D/vsnap.toml"
CPATH="$D/bin:$CBIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
resolved=$(PATH="$CPATH" command -v runc)
[ "$resolved" = "$RUNC" ] || { echo "bench: runc on containerd's PATH is $resolved, not $RUNC" >&2; exit 1; }
[ "$(PATH="$CPATH" command -v "$GO_SHIM_NAME")" = "$CBIN/$GO_SHIM_NAME" ] ||
    { echo "bench: $GO_SHIM_NAME does not resolve to $CBIN" >&2; exit 1; }

say "starting a private containerd in $D (log level $LOG_LEVEL)"
PATH="$CPATH" "$CBIN/containerd" --config "$D/config.toml" >"$D/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
"${CTR[@]}" version >/dev/null || { echo "bench: containerd did not come up" >&2; exit 1; }

VSNAP_ARGS=(--runtime io.vsnap.v1 --runtime-config-path "$D/vsnap.toml")
RUNCV2_ARGS=(--runtime io.containerd.runc.v2 --runc-binary "$RUNC")
B_LABEL="io.containerd.runc.v2 (containerd's Go shim)"
B_NAME=runc-v2
if [ -n "$AGAINST" ]; then # the second runtime is the other vsnap binary
    RUNCV2_ARGS=(--runtime io.vsnapb.v1 --runtime-config-path "$D/vsnap.toml")
    B_LABEL="io.vsnapb.v1 (BENCH_AGAINST: $AGAINST)"
    B_NAME=BENCH_AGAINST
fi
rt_args() { # vsnap|runcv2 -> the name of its ctr flag array
    case "$1" in vsnap) echo VSNAP_ARGS ;; runcv2) echo RUNCV2_ARGS ;; esac
}

# --- 1. ctr run --rm /bin/true ----------------------------------------------------------
N=0
# One timed `ctr run --rm`; its wall time in microseconds goes to the variable LAST_US.
run_true() {
    local which=$1 id t0 t1
    local -n args=$(rt_args "$which")
    N=$((N + 1))
    id="bench-$which-$$-$N"
    t0=$EPOCHREALTIME
    if ! "${CTR[@]}" run --rm "${args[@]}" --rootfs "$D/rootfs" "$id" /bin/true >"$D/run.out" 2>&1; then
        echo "bench: ctr run ($which, $id) failed:" >&2
        cat "$D/run.out" >&2
        exit 1
    fi
    t1=$EPOCHREALTIME
    LAST_US=$((${t1/./} - ${t0/./}))
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
say "warm-up: $WARMUP run(s) of each runtime"
for _ in $(seq "$WARMUP"); do
    run_true vsnap
    run_true runcv2
done
say "measuring: $RUNS pairs of ctr run --rm /bin/true (ABBA order)"
VS_US=()
RC_US=()
for i in $(seq "$RUNS"); do
    if [ $((i % 2)) -eq 1 ]; then order=(vsnap runcv2); else order=(runcv2 vsnap); fi
    for w in "${order[@]}"; do
        run_true "$w"
        if [ "$w" = vsnap ]; then VS_US+=("$LAST_US"); else RC_US+=("$LAST_US"); fi
    done
    if [ $((i % 10)) -eq 0 ]; then say "  $i/$RUNS pairs done"; fi
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# Quantile q (linear interpolation between order statistics) of microsecond values on
# stdin, printed in seconds with 3 decimals.
quantile() {
    sort -n | awk -v q="$1" '{ v[NR] = $1 } END {
        r = (NR - 1) * q; lo = int(r); f = r - lo;
        x = v[lo + 1]; if (lo + 2 <= NR) x += f * (v[lo + 2] - v[lo + 1]);
        printf "%.3f", x / 1e6 }'
}
stats() { # microsecond values... -> "median p10 p90" in seconds
    local a=("$@")
    printf '%s %s %s' "$(printf '%s\n' "${a[@]}" | quantile 0.5)" \
        "$(printf '%s\n' "${a[@]}" | quantile 0.1)" "$(printf '%s\n' "${a[@]}" | quantile 0.9)"
}
read -r VS_MED VS_P10 VS_P90 <<<"$(stats "${VS_US[@]}")"
read -r RC_MED RC_P10 RC_P90 <<<"$(stats "${RC_US[@]}")"
RATIO=$(awk -v a="$VS_MED" -v b="$RC_MED" 'BEGIN { printf "%.2f", a / b }')
PAIR_RATIO=$(for i in "${!VS_US[@]}"; do
    awk -v a="${VS_US[$i]}" -v b="${RC_US[$i]}" 'BEGIN { printf "%.6f\n", a / b }'
done | sort -n | awk '{ v[NR] = $1 } END {
    r = (NR - 1) * 0.5; lo = int(r); f = r - lo; x = v[lo + 1];
    if (lo + 2 <= NR) x += f * (v[lo + 2] - v[lo + 1]); printf "%.2f", x }')

# --- 2. memory of one idle shim ---------------------------------------------------------
kib_field() { awk -v k="$1:" '$1 == k { print $2; found = 1 } END { if (!found) print "" }' "$2" 2>/dev/null; }
mib() { [ -n "$1" ] && awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }' || printf 'n/a'; }

measure_mem() { # vsnap|runcv2 binary-name [other-name] -> sets MEM_<which>_* variables
    local which=$1 bin=$2 alt=${3:-$2} id tpid spid ppid p cands=() argv=()
    local -n args=$(rt_args "$which")
    id="bench-mem-$which-$$"
    "${CTR[@]}" run -d "${args[@]}" --rootfs "$D/rootfs" "$id" /bin/sleep 1000 >"$D/run.out" 2>&1 ||
        { echo "bench: ctr run -d ($which) failed:" >&2; cat "$D/run.out" >&2; exit 1; }
    tpid=$("${CTR[@]}" task ls | awk -v id="$id" '$1 == id { print $2 }')
    [ -n "$tpid" ] && [ -d "/proc/$tpid" ] || { echo "bench: no task pid for $id" >&2; exit 1; }
    # The long-running shim: the process running $bin with "-id $id" (its `start`
    # invocation has exited by now); it is also the parent (subreaper) of the task.
    cands=()
    for p in $(procs_with "$bin" "$alt" " -id $id "); do
        mapfile -d '' -t argv 2>/dev/null <"/proc/$p/cmdline" || continue
        [[ " ${argv[*]} " == *" start "* || " ${argv[*]} " == *" delete "* ]] || cands+=("$p")
    done
    [ "${#cands[@]}" -eq 1 ] || { echo "bench: found ${#cands[@]} $bin processes for $id: ${cands[*]}" >&2; exit 1; }
    spid=${cands[0]}
    ppid=$(awk '$1 == "PPid:" { print $2 }' "/proc/$tpid/status")
    [ "$ppid" = "$spid" ] || say "note: $which task $tpid has parent $ppid, not the shim $spid"
    sleep 2 # let it go idle (the Go runtime's background GC, the Rust runtime's timers)
    local st="/proc/$spid/status" sm="/proc/$spid/smaps_rollup" uss=
    printf -v "MEM_${which}_PID" '%s' "$spid"
    printf -v "MEM_${which}_RSS" '%s' "$(mib "$(kib_field VmRSS "$st")")"
    printf -v "MEM_${which}_ANON" '%s' "$(mib "$(kib_field RssAnon "$st")")"
    printf -v "MEM_${which}_FILE" '%s' "$(mib "$(kib_field RssFile "$st")")"
    printf -v "MEM_${which}_THREADS" '%s' "$(kib_field Threads "$st")"
    printf -v "MEM_${which}_PSS" '%s' "$(mib "$(kib_field Pss "$sm")")"
    if [ -r "$sm" ]; then
        uss=$(awk '$1 == "Private_Clean:" || $1 == "Private_Dirty:" { s += $2 } END { print s }' "$sm")
    fi
    printf -v "MEM_${which}_USS" '%s' "$(mib "$uss")"
    "${CTR[@]}" task kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    for _ in $(seq 50); do "${CTR[@]}" task delete "$id" >/dev/null 2>&1 && break; sleep 0.1; done
    "${CTR[@]}" c rm "$id" >/dev/null
}
say "measuring idle shim memory (a container running sleep 1000 under each)"
measure_mem vsnap "$SHIM_NAME" "$(basename "$SHIM")"
if [ -n "$AGAINST" ]; then
    measure_mem runcv2 containerd-shim-vsnapb-v1 "$(basename "$AGAINST")"
else
    measure_mem runcv2 "$GO_SHIM_NAME"
fi

# --- report -----------------------------------------------------------------------------
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- shim config 2>/dev/null || git_rev="$git_rev (shim/ or config/ modified)"
{
    echo "## vsnap shim benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Machine: $(nproc) CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), kernel $(uname -r),"
    echo "$("$CBIN/containerd" --version | sed 's/ *$//'), $("$RUNC" --version | head -n 1),"
    echo "vsnap shim $SHIM (git $git_rev, release build of $(date -u -r "$SHIM" '+%Y-%m-%d %H:%M UTC')),"
    echo "Go shim $CBIN/$GO_SHIM_NAME. Load average before / after the timed runs: $LOAD_BEFORE / $LOAD_AFTER."
    echo
    echo "### \`ctr run --rm --rootfs DIR ID /bin/true\` wall time ($RUNS paired runs, ABBA order, $WARMUP warm-up runs each)"
    echo
    echo "| runtime | median (s) | p10 (s) | p90 (s) |"
    echo "|---|---:|---:|---:|"
    echo "| io.vsnap.v1 (vsnap, Rust) | $VS_MED | $VS_P10 | $VS_P90 |"
    echo "| $B_LABEL | $RC_MED | $RC_P10 | $RC_P90 |"
    echo
    echo "Ratio of medians vsnap / $B_NAME: **$RATIO** (median of the $RUNS per-pair ratios: $PAIR_RATIO)."
    echo
    echo "### Idle shim memory (one shim serving a container that runs \`sleep 1000\`)"
    echo
    echo "| runtime | VmRSS (MiB) | RssAnon (MiB) | RssFile (MiB) | Pss (MiB) | USS (MiB) | threads |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    echo "| io.vsnap.v1 (vsnap, Rust) | $MEM_vsnap_RSS | $MEM_vsnap_ANON | $MEM_vsnap_FILE | $MEM_vsnap_PSS | $MEM_vsnap_USS | $MEM_vsnap_THREADS |"
    echo "| $B_LABEL | $MEM_runcv2_RSS | $MEM_runcv2_ANON | $MEM_runcv2_FILE | $MEM_runcv2_PSS | $MEM_runcv2_USS | $MEM_runcv2_THREADS |"
    echo
    echo "VmRSS, RssAnon, RssFile, threads: /proc/PID/status; Pss and USS (Private_Clean + Private_Dirty):"
    echo "/proc/PID/smaps_rollup. MiB = 1024 KiB."
} >"$D/report.md"
cat "$D/report.md"
if [ -n "${BENCH_OUT:-}" ]; then
    cp "$D/report.md" "$BENCH_OUT"
    say "report written to $BENCH_OUT"
fi
say "done"
