#!/usr/bin/env bash
# Memory at scale: the peak resident memory of proftap and of the program
# it records when every call of four functions is timed, from about ten
# million calls to a billion. examples/calls.c N 1 calls run, left, right
# and leaf 3.5 N times in all; `proftap run -f ...` keeps every probe (no
# governor, no sampling). The program's peak is its VmHWM, read every
# 0.1 s while it runs (the last reading before it ends).
# Usage: benches/scale.sh [N...]   default: 3000000 300000000. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 3000000 300000000
cargo build --release --quiet --bins
proftap=$PWD/target/release/proftap
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O2 -g -no-pie -o "$dir/calls" examples/calls.c

# The last VmHWM (KB) of the only child of process $1, until it ends.
child_peak() {
    local child='' peak=0 hwm
    while kill -0 "$1" 2>/dev/null; do
        [ -n "$child" ] || child=$(pgrep -P "$1" | head -1 || true)
        if [ -n "$child" ] && hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$child/status" 2>/dev/null) && [ -n "$hwm" ]; then
            peak=$hwm
        fi
        sleep 0.1
    done
    echo "$peak"
}

printf '%-11s %-14s %-5s %-18s %-18s %-8s %-8s\n' N calls lost 'proftap max RSS' 'program peak RSS' time bare
for n in "$@"; do
    bare=$( { /usr/bin/time -f '%e %M' "$dir/calls" "$n" 1 >/dev/null; } 2>&1 | tail -1)
    /usr/bin/time -f '%e %M' -o "$dir/time" "$proftap" run -o "$dir/p.profile" -f run -f left -f right -f leaf -- "$dir/calls" "$n" 1 \
        >/dev/null 2>"$dir/err" &
    recording=$!
    # /usr/bin/time's child is proftap; proftap's is the program.
    while [ -z "$(pgrep -P "$recording" || true)" ] && kill -0 "$recording" 2>/dev/null; do sleep 0.01; done
    peak=$(child_peak "$(pgrep -P "$recording" | head -1)")
    wait "$recording" || { echo "proftap run failed at N=$n:" >&2; cat "$dir/err" >&2; exit 1; }
    read -r calls lost < <("$proftap" report --format json "$dir/p.profile" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sum(f["calls"] for f in d["functions"]), d["lost"]["events"])')
    read -r seconds rss < "$dir/time"
    printf '%-11s %-14s %-5s %-18s %-18s %-8s %-8s\n' "$n" "$calls" "$lost" "$((rss / 1024)) MB" "$peak KB" "$seconds s" "${bare%% *} s (${bare##* } KB)"
done
