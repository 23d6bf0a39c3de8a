#!/usr/bin/env bash
# The project's benchmarks, one entry point. Run as root (--list needs no root).
#
#   ./scripts/bench.sh [NAME...]   run the named benchmarks, one after the other;
#                                  no NAME: shim
#   ./scripts/bench.sh all         every benchmark, in the order of --list
#   ./scripts/bench.sh --list      the names, one line each saying what it measures
#
# Each benchmark's report (markdown) goes to stdout, its progress to stderr; with more
# than one NAME a blank line separates the reports and the first one that fails ends
# the run with its exit status. Each benchmark reads its own environment variables, as
# below; one set for several NAMEs applies to each of them (BENCH_RUNS counts pairs for
# one and restores for another).
#
# shim and snapshot are bash: scripts/bench/shim.sh and scripts/bench/snapshot.sh, whose
# headers (and docs/benchmarks.md) list their settings. The others are examples of the
# e2e crate, tests/examples/bench_NAME.rs (NAME with _ for -), run against release
# builds of the shim, the reference engine and the CLI in cargo's target folder
# (CARGO_TARGET_DIR, else target/). Their settings and defaults:
#   cri            BENCH_RUNS=1 (pairs), BENCH_RESIDENT_MB=1024
#   pods           BENCH_RUNS=3 (rounds), BENCH_RESIDENT_MB=1024
#   concurrent     BENCH_RUNS=2 (rounds per shim), BENCH_COPIES=8, BENCH_RESIDENT_MB=1024,
#                  BENCH_AGAINST=SHIM (each round also by that shim binary, ABBA),
#                  BENCH_SHARE_OFF=1 (each round also with share_pages = false, ABBA)
#   fallback       BENCH_RUNS=3 (pairs), BENCH_RESIDENT_MB=512, BENCH_INIT_MS=2000
#   fleet          BENCH_RUNS=3 (pairs), BENCH_RESIDENT_MB=512, BENCH_LINK_MBPS (unset: loopback)
#   fleet-crypt    BENCH_RUNS=3, BENCH_RESIDENT_MB=512, BENCH_LINK_MBPS (unset: loopback)
#   fleet-restore  BENCH_RUNS=3 (rounds), BENCH_RESIDENT_MB=512, BENCH_INIT_MS=5000,
#                  BENCH_LINK_MBPS (unset: loopback)
#   lifecycle      BENCH_RESTORES=5, BENCH_RESIDENT_MB=1024
#   real-engine    BENCH_RUNS=5 (restores per case), BENCH_LAYER_MB=0,100,1024
#   restore-limits BENCH_RUNS=5 (warm restores), BENCH_COLD_RUNS=3, BENCH_RESIDENT_MB=2048,
#                  BENCH_COMPARE (a config line: every restore also under it; no-criu-cache: also
#                  without CRIU's kernel-probe cache), BENCH_AGAINST=SHIM (every restore also by
#                  that shim binary, the build before a change), BENCH_KEEP_LOGS=DIR
#   verify         BENCH_RUNS=4 (pairs per cache state), BENCH_RESIDENT_MB=1024
#   zero-pages     BENCH_RUNS=3 (restores of each), BENCH_RESIDENT_MB=512 (as many MiB of zero pages)
#   huge-pages     BENCH_RUNS=3 (rounds), BENCH_RESIDENT_MB=1024, BENCH_FRAGMENT=1 (each policy also on
#                  a host whose free memory the bench cut up: BENCH_FRAGMENT_BLOCKS=64,
#                  BENCH_FRAGMENT_MAX_MB=all but 2 GiB of the free memory)
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null

NAMES=(shim snapshot cri pods concurrent fallback fleet fleet-crypt fleet-restore lifecycle real-engine restore-limits verify zero-pages huge-pages)
declare -A WHAT=(
    [shim]="vsnap's shim vs containerd's runc shim: \`ctr run --rm /bin/true\` wall time, idle shim memory (default)"
    [snapshot]="reference engine: create (capture + publish), restore vs cold start, checkpoint and restore throughput"
    [cri]="a restore through CRI (StartContainer) beside the same restore through \`ctr run -d\`"
    [pods]="a restore into a new CNI pod of a Deployment beside a host-network pod's (its twin) and the new pod's cold start"
    [concurrent]="8 restores of one artifact started at once: each copy's phases, aggregate placement vs the fill limit, wall until all serve"
    [fallback]="an \`auto\` start whose artifact is set aside (refused restore + cold start + capture) vs a plain create"
    [fleet]="\`vsnap push\` to a loopback registry, then \`vsnap pull\` vs a raw cat + sync and parallel curls of the same bytes"
    [fleet-crypt]="\`vsnap push\` and \`vsnap pull\` in clear vs encrypted (fleet_encryption_key), same artifact; seal/open/sha256 per core"
    [fleet-restore]="a restore from a registry reference on a host without the artifact, streamed and staged, vs the pull alone, cold start and local restore"
    [lifecycle]="State and Stats latency of a shim idle and restoring; a kill of a restoring container until STOPPED"
    [real-engine]="vLLM 0.33.0's snapshot server over the stand-in engine; what carrying the writable layer costs"
    [zero-pages]="an engine half zero pages captured with and without elision: image bytes, digest phase, warm restores"
    [huge-pages]="an advised engine restored under huge_pages when-free, always and never, on a host as it is and cut up"
    [restore-limits]="warm and cold restores against the machine's fill limit and the disk's cold read; phases"
    [verify]="restores with verify_contents on vs off, warm page cache and after dropping it"
)

list() {
    local n
    for n in "${NAMES[@]}"; do printf '%-14s %s\n' "$n" "${WHAT[$n]}"; done
}

known() {
    local n
    for n in "${NAMES[@]}"; do [ "$n" = "$1" ] && return 0; done
    return 1
}

usage() {
    echo "usage: scripts/bench.sh [NAME...] | all | --list"
    echo "benchmarks (scripts/bench.sh --list):"
    list | sed 's/^/  /'
}

# Runs one benchmark; its exit status is the benchmark's.
run_one() {
    case "$1" in
        shim | snapshot) "scripts/bench/$1.sh" ;;
        real-engine) (
            . scripts/lib.sh
            BENCH_DATE=$(date -u +%Y-%m-%d)
            export BENCH_DATE
            vsnap_bench_example bench_real_engine
        ) ;;
        *) (
            . scripts/lib.sh
            vsnap_bench_example "bench_${1//-/_}"
        ) ;;
    esac
}

todo=()
for a in "$@"; do
    case "$a" in
        -l | --list) list; exit 0 ;;
        -h | --help) usage; exit 0 ;;
        all) todo+=("${NAMES[@]}") ;;
        *)
            if ! known "$a"; then
                echo "bench: no benchmark named '$a'" >&2
                usage >&2
                exit 2
            fi
            todo+=("$a")
            ;;
    esac
done
[ "${#todo[@]}" -gt 0 ] || todo=(shim)

i=0
for n in "${todo[@]}"; do
    i=$((i + 1))
    if [ "${#todo[@]}" -gt 1 ]; then
        [ "$i" -eq 1 ] || echo
        printf 'bench: %s (%d of %d)\n' "$n" "$i" "${#todo[@]}" >&2
    fi
    run_one "$n"
done
