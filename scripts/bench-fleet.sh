#!/usr/bin/env bash
# Benchmark of the fleet transport (tests/examples/bench_fleet.rs): one private
# containerd captures the reference engine, `vsnap push` sends the artifact to a
# docker-registry on 127.0.0.1, then `vsnap pull` and a raw `cat` + `sync` of the same
# bytes (the registry's chunk files) alternate in the same run. Release builds.
# Results (markdown) on stdout. Run as root.
#
# Environment: BENCH_RUNS=3 (pairs), BENCH_RESIDENT_MB=512.
set -euo pipefail
cd "$(dirname "$0")/.."
exec </dev/null
. scripts/lib.sh
vsnap_bench_example bench_fleet
