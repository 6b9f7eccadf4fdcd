#!/usr/bin/env bash
# Recordings in a row of a threaded program: `proftap run` (the default:
# hybrid, sampling) of examples/threads.c at -O2, RUNS times. Each must
# exit 0, write its profile and count work()'s 11,000 calls exactly
# (timed, or counted after a throttle), with no event lost. Prints how
# many runs did, and what went wrong in those that did not.
# Usage: benches/runs.sh [RUNS]   default 100. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
cargo build --release --quiet --bins
proftap=$PWD/target/release/proftap
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O2 -g -pthread -o "$dir/threads" examples/threads.c

good=0
for run in $(seq "$runs"); do
    rm -f "$dir/p.profile"
    if ! "$proftap" run -o "$dir/p.profile" -- "$dir/threads" >/dev/null 2>"$dir/err"; then
        echo "run $run: proftap failed: $(tail -1 "$dir/err")"
        continue
    fi
    if ! verdict=$("$proftap" report --format json "$dir/p.profile" | python3 -c '
import json, sys
d = json.load(sys.stdin)
work = [f for f in d["functions"] if f["name"] == "work"]
calls = sum(f["calls"] + (f["calls_after_throttle"] or 0) for f in work)
stopped = sum(f.get("calls_counted_until_stopped") or 0 for f in work)
lost = d["lost"]["events"]
if stopped:
    print(f"counting stopped by the governor: {calls} calls timed or counted, {stopped} more until it stopped")
else:
    print("ok" if calls == 11000 and lost == 0 else f"work {calls} of 11000 calls, {lost} events lost")'); then
        echo "run $run: the profile cannot be read"
        continue
    fi
    if [ "$verdict" = ok ]; then good=$((good + 1)); else echo "run $run: $verdict"; fi
done
echo "$good of $runs recordings exact"
