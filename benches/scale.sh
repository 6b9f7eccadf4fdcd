#!/usr/bin/env bash
# Memory at scale: the peak resident memory of proftap and of the program
# it records when every call of four functions is timed, from about ten
# million calls to a billion. examples/calls.c N 1 calls run once and
# left, right and leaf 3.5 N times in all; `proftap run -f ...` keeps
# every probe (no governor, no sampling), and every count is checked.
# Each peak is the process's VmHWM, read every 0.1 s while it runs (the
# last reading before it ends; "?" if none was taken).
# Usage: benches/scale.sh [N...]   default: 3000000 300000000. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 3000000 300000000
cargo build --release --quiet --bins
proftap=$PWD/target/release/proftap
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O2 -g -no-pie -o "$dir/calls" examples/calls.c

# VmHWM of process $1 in KB, or nothing.
hwm() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || true; }

printf '%-11s %-14s %-5s %-16s %-17s %-9s %s\n' N calls lost 'proftap peak' 'program peak' time 'bare (peak)'
for n in "$@"; do
    bare=$( { /usr/bin/time -f '%e s (%M KB)' "$dir/calls" "$n" 1 >/dev/null; } 2>&1 | tail -1)
    started=$(date +%s%N)
    "$proftap" run -o "$dir/p.profile" -f run -f left -f right -f leaf -- "$dir/calls" "$n" 1 >/dev/null 2>"$dir/err" &
    recording=$!
    own='?' program='?' child=''
    while kill -0 "$recording" 2>/dev/null; do
        [ -n "$child" ] || child=$(pgrep -P "$recording" | head -1 || true)
        kb=$(hwm "$recording"); [ -z "$kb" ] || own=$kb
        # Read only once the child runs the program, not proftap's copy before its exec.
        if [ -n "$child" ] && [ "$(readlink "/proc/$child/exe" 2>/dev/null)" = "$dir/calls" ]; then
            kb=$(hwm "$child"); [ -z "$kb" ] || program=$kb
        fi
        sleep 0.1
    done
    wait "$recording" || { echo "proftap run failed at N=$n:" >&2; cat "$dir/err" >&2; exit 1; }
    seconds=$(awk -v ns=$(($(date +%s%N) - started)) 'BEGIN {printf "%.2f", ns / 1e9}')
    counted=$("$proftap" report --format json "$dir/p.profile" | python3 -c '
import json, sys
n = int(sys.argv[1])
d = json.load(sys.stdin)
calls = sum(f["calls"] for f in d["functions"])
# run once, left n times, right n/2 times, leaf n + 2 (n/2) times.
expected = 1 + n + n // 2 + n + 2 * (n // 2)
if calls != expected:
    sys.exit(f"{calls} calls counted, {expected} made")
print(calls, d["lost"]["events"])' "$n") || { echo "N=$n: the profile's counts are wrong" >&2; exit 1; }
    read -r calls lost <<<"$counted"
    printf '%-11s %-14s %-5s %-16s %-17s %-9s %s\n' "$n" "$calls" "$lost" "$own KB" "$program KB" "$seconds s" "$bare"
done
