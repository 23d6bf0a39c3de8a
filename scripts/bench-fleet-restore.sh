#!/usr/bin/env bash
# Benchmark of a restore straight from a registry reference on a host without the
# artifact (tests/examples/bench_fleet_restore.rs): two private containerd instances
# (hosts A and B) and a docker-registry on loopback; on B, side by side: a cold start,
# a restore with vsnap.io/artifact-ref after `vsnap rm` (pull + restore), and a
# restore of the artifact then present. Release builds. Results (markdown) on stdout.
# Run as root.
#
# Environment: BENCH_RUNS=3, BENCH_RESIDENT_MB=512, BENCH_INIT_MS=5000.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
. scripts/lib.sh
vsnap_bench_example bench_fleet_restore
