#!/usr/bin/env bash
# Benchmark of real engine shapes (tests/examples/bench_real_engine.rs): vLLM 0.33.0's
# snapshot server over the stand-in engine (create, restores, restore / cold start), and
# what carrying the writable layer costs a capture and a restore (0, 100 MiB, 1 GiB).
# One private containerd, release builds. Results (markdown) on stdout. Run as root.
#
# Environment: BENCH_RUNS=5 (restores per case), BENCH_LAYER_MB=0,100,1024.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
. scripts/lib.sh
export BENCH_DATE=$(date -u +%Y-%m-%d)
vsnap_bench_example bench_real_engine
