#!/usr/bin/env bash
# Builds proftap and profiles bundled example programs end to end: where a
# program's functions are, how often each ran and what each cost, as a call
# tree; then the default hybrid mode on a program calling a tiny function
# 100 million times, and its flame graph.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --release --quiet --bins
out=target/examples
mkdir -p "$out"
gcc -O0 -g -o "$out/calls" examples/calls.c
gcc -O2 -g -o "$out/hot" examples/hot.c
proftap=target/release/proftap
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)

echo "== proftap symbols $out/calls"
"$proftap" symbols "$out/calls"
echo
echo "== proftap run --overhead-budget 0 -o $out/calls.profile -- $out/calls 1000 15    (exact: every probe kept)"
"${sudo[@]}" "$proftap" run --overhead-budget 0 -o "$out/calls.profile" -- "$out/calls" 1000 15
echo
echo "== proftap report $out/calls.profile --tree"
"$proftap" report "$out/calls.profile" --tree
echo
echo "== proftap run -o $out/hot.profile -- $out/hot 100    (hybrid default: instrumented, sampled, governed)"
"${sudo[@]}" "$proftap" run -o "$out/hot.profile" -- "$out/hot" 100
echo
echo "== proftap report $out/hot.profile --metric wall"
"$proftap" report "$out/hot.profile" --metric wall
echo
echo "== proftap flamegraph $out/hot.profile -o $out/hot.svg"
"$proftap" flamegraph "$out/hot.profile" -o "$out/hot.svg"
echo "wrote $out/hot.svg"
