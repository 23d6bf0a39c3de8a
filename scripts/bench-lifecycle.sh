#!/usr/bin/env bash
# Benchmark of a shim under a restore, side by side in one run on a private
# containerd (tests/examples/bench_lifecycle.rs): State and Stats latency while the
# shim is idle and while it restores a BENCH_RESIDENT_MB artifact, and the time from a
# kill of a restoring container to its Start returning and its State saying STOPPED.
# Release builds. Results (markdown) on stdout. Run as root.
#
# Environment: BENCH_RESTORES=5, BENCH_RESIDENT_MB=1024.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
. scripts/lib.sh
vsnap_bench_example bench_lifecycle
