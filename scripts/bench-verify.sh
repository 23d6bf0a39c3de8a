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
[ "$(id -u)" -eq 0 ] || { echo "bench: must run as root" >&2; exit 1; }
./scripts/setup.sh >&2
. scripts/lib.sh
vsnap_path
cargo build --release -p vsnap-shim -p vsnap-ref-engine -p vsnap-cli >&2
export VSNAP_SHIM_BIN="$PWD/target/release/containerd-shim-vsnap-v1"
cargo run --release -q -p vsnap-e2e --example bench_verify
