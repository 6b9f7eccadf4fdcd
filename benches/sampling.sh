#!/usr/bin/env bash
# Sampling overhead: examples/split.c (CPU-bound, -O2, frame pointers
# omitted) bare, under `perf record` at the same frequencies with frame-pointer
# (-g) and DWARF (--call-graph dwarf) call chains, and under
# `proftap run --no-instrument --sample HZ` (DWARF unwinding of a 16 KiB copy
# of the stack, symbolized while recording). Whole commands, hyperfine.
# Usage: benches/sampling.sh [MILLIONS [RUNS]]   defaults: 400, 5. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-400}
runs=${2:-5}
cargo build --release --quiet --bins
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
proftap=$PWD/target/release/proftap
gcc -O2 -g -fomit-frame-pointer -o "$dir/split" examples/split.c
commands=("$dir/split $work")
for hz in 1000 10000; do
  # --no-bpf-event: see benches/realprogs.sh.
  commands+=("perf record -q --no-bpf-event -F $hz -g -o $dir/fp.data -- $dir/split $work")
  commands+=("perf record -q --no-bpf-event -F $hz --call-graph dwarf,16384 -o $dir/dwarf.data -- $dir/split $work")
  commands+=("$proftap run --no-instrument --sample $hz -o $dir/p.profile -- $dir/split $work")
done
hyperfine -N --warmup 1 --runs "$runs" --export-markdown "$dir/table.md" --output null "${commands[@]}" >/dev/null
sed "s|$dir/||g; s|$proftap|proftap|g" "$dir/table.md"
