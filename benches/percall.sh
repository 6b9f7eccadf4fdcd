#!/usr/bin/env bash
# Per-call cost (entry and return) of instrumenting a tiny function called in
# a tight loop: no probes, the kernel floor (a counting uprobe + uretprobe
# opened with perf_event_open and nothing else), proftap run -f f with
# uprobes and with the in-process engine (adding up only, and keeping every
# call with --trace), bpftrace with a uprobe/uretprobe
# pair doing the same accounting, and uftrace's run-time patching
# (uftrace record -P f, when uftrace is installed). The loop reports its own
# nanoseconds per call; the median of RUNS runs is shown. Then what the
# instructions a call cannot do without cost here take alone
# (benches/percall/parts.c: the TSC, read twice a timed call; the CPU's id
# and a counter's increment, a counted call's), the median of RUNS runs.
# Usage: benches/percall.sh [CALLS [RUNS]]   defaults: 300000, 5. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-300000}
runs=${2:-5}
cargo build --release --quiet --bins
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
proftap=$PWD/target/release/proftap
for opt in O0 O2; do
  gcc -$opt -g -o "$dir/loop-$opt" benches/percall/loop.c
done
gcc -O2 -o "$dir/floor" benches/percall/floor.c

source benches/common.sh
measure() { for _ in $(seq "$runs"); do "$@" 2>/dev/null | grep -E '^[0-9.]+$' | tail -1; done | median; }

printf '%-4s %-10s %10s %10s %10s %10s %10s %10s %13s %14s\n' opt first-insn bare floor proftap bpftrace proftap/floor inject inject-trace uftrace-P
for opt in O0 O2; do
  loop=$dir/loop-$opt
  offset=$("$proftap" symbols "$loop" -f f --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["functions"][0]["file_offset"])')
  # awk reads to the end: leaving early would end objdump with SIGPIPE, which pipefail makes fatal.
  first=$(objdump -d "$loop" --no-show-raw-insn | awk '/<f>:/ && !seen {getline; print $2; seen = 1}')
  bare=$(measure "$loop" "$calls")
  floor=$(measure "$dir/floor" "$loop" "$offset" "$loop" "$calls")
  ours=$(measure "$proftap" run --engine uprobe -f f -o "$dir/p.profile" -- "$loop" "$calls")
  theirs=-
  if command -v bpftrace >/dev/null; then
    theirs=$(measure bpftrace -q -e "uprobe:$loop:f { @s[tid] = nsecs; } uretprobe:$loop:f { @t = sum(nsecs - @s[tid]); @n = count(); delete(@s[tid]); }" -c "$loop $calls")
  fi
  ratio=$(awk -v a="$ours" -v b="$floor" -v z="$bare" 'BEGIN { printf "%.2f", (a - z) / (b - z) }')
  inject=$(measure "$proftap" run --engine inject -f f -o "$dir/i.profile" -- "$loop" "$calls")
  traced=$(measure "$proftap" run --engine inject --trace --trace-size 1G -f f -o "$dir/t.profile" -- "$loop" "$calls")
  uftrace=-
  if command -v uftrace >/dev/null; then
    uftrace=$(measure uftrace record -d "$dir/uftrace.data" -P f "$loop" "$calls")
  fi
  printf '%-4s %-10s %10s %10s %10s %10s %10s %10s %13s %14s\n' "$opt" "$first" "$bare" "$floor" "$ours" "$theirs" "$ratio" "$inject" "$traced" "$uftrace"
done
gcc -O2 -o "$dir/parts" benches/percall/parts.c
for _ in $(seq "$runs"); do "$dir/parts"; done >"$dir/parts.txt"
printf '\n%-16s %s\n' instruction ns
for name in rdtsc rdpid stores stores+inc stores+lock-inc; do
  printf '%-16s %s\n' "$name" "$(awk -v n="$name" '$1 == n {print $2}' "$dir/parts.txt" | median)"
done
