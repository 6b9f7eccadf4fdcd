#!/usr/bin/env bash
# Builds proftap and profiles a bundled example program end to end: where its
# functions are, how often each ran and what each cost, as a call tree.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --release --quiet --bins
out=target/examples
mkdir -p "$out"
gcc -O0 -g -o "$out/calls" examples/calls.c
proftap=target/release/proftap
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)

echo "== proftap symbols $out/calls"
"$proftap" symbols "$out/calls"
echo
echo "== proftap run -o $out/calls.profile -- $out/calls 1000 15"
"${sudo[@]}" "$proftap" run -o "$out/calls.profile" -- "$out/calls" 1000 15
echo
echo "== proftap report $out/calls.profile --tree"
"$proftap" report "$out/calls.profile" --tree
