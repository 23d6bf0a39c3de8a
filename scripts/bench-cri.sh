#!/usr/bin/env bash
# Benchmark of a restore through CRI beside the same restore through ctr
# (tests/examples/bench_cri.rs): one private containerd with the CRI plugin on,
# a 1 GiB artifact per path, StartContainer vs `ctr run -d`, side by side.
# Release builds. Results (markdown) on stdout. Run as root.
#
# Environment: BENCH_RUNS=1 (pairs), BENCH_RESIDENT_MB=1024.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
. scripts/lib.sh
vsnap_bench_example bench_cri
