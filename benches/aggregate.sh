#!/usr/bin/env bash
# Aggregator throughput on a recorded event stream (one core): records
# examples/calls.c (recursion, two callers of a leaf) and replays its ordered
# probe hits through the aggregator. Needs root (it records).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bins
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O0 -g -o "$dir/calls" examples/calls.c
PROFTAP_SAVE_EVENTS="$dir/events" target/release/proftap run --engine uprobe --overhead-budget 0 --no-sample -o "$dir/p.profile" -- "$dir/calls" 200000 18 >/dev/null
functions=$(target/release/proftap report "$dir/p.profile" --format json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["functions"]))')
cargo bench --quiet -p proftap-record --bench aggregate -- "$dir/events" "$functions" 2
