#!/usr/bin/env bash
# Aggregator throughput on a recorded event stream (one core): records
# examples/calls.c (recursion, two callers of a leaf) and replays its ordered
# events through the aggregator. Needs root (it records).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bins
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O0 -g -o "$dir/calls" examples/calls.c
target/release/proftap run --save-events "$dir/events" --engine uprobe --overhead-budget 0 --no-sample -o "$dir/p.profile" -- "$dir/calls" 200000 18 >/dev/null
cargo bench --quiet -p proftap-record --bench aggregate -- "$dir/events"
