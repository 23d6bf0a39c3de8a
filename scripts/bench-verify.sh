#!/usr/bin/env bash
# Benchmark of content verification at restore (tests/examples/bench_verify.rs): one
# private containerd, one artifact, restores with verify_contents on and off side by
# side (ABBA), warm page cache and after dropping it (machine-wide). Release builds.
# Results (markdown) on stdout. Run as root.
#
# Environment: BENCH_RUNS=4 (pairs per cache state), BENCH_RESIDENT_MB=1024.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
. scripts/lib.sh
vsnap_bench_example bench_verify
