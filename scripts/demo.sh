#!/usr/bin/env bash
# Builds proftap and a bundled example, then shows what proftap sees in it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo build --release --quiet --bins
out=target/examples
mkdir -p "$out"
gcc -O2 -g -o "$out/calls" examples/calls.c

echo "== proftap symbols $out/calls"
target/release/proftap symbols "$out/calls"
echo
echo "== proftap symbols $out/calls -f 'l*' --lines"
target/release/proftap symbols "$out/calls" -f 'l*' --lines
