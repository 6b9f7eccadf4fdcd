#!/usr/bin/env bash
# Records the golden tests' event streams again (tests/golden/*/events.jsonl)
# and blesses their expected reports from them. Needs root (it records) and
# the compilers of scripts/setup.sh. Each stream is one recording of a small
# example program; tests/golden.rs replays it through the aggregator and the
# assembly and compares the reports with the committed ones.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bins
proftap=target/debug/proftap
# A fixed place, so the streams name the same paths each time.
bin=/tmp/proftap-golden
mkdir -p "$bin"
gcc -O0 -g -o "$bin/calls" examples/calls.c
gcc -O2 -g -o "$bin/threads" examples/threads.c -lpthread
g++ -O0 -g -o "$bin/shapes" examples/shapes.cpp
gcc -O0 -g -o "$bin/coverage" examples/coverage.c
gcc -O2 -g -o "$bin/cpuwall" examples/cpuwall.c
gcc -O2 -g -o "$bin/jumps" examples/jumps.c

save() {
    local name=$1
    shift
    mkdir -p "tests/golden/$name"
    "$proftap" run --save-events "tests/golden/$name/events.jsonl" -o "$bin/$name.profile" "$@" >/dev/null
}
exact=(--overhead-budget 0 --no-sample)
for engine in uprobe inject; do
    save "calls-$engine" --engine "$engine" "${exact[@]}" -- "$bin/calls" 20 6
    save "threads-$engine" --engine "$engine" "${exact[@]}" -f work -f main -- "$bin/threads" 3 20
    save "throws-$engine" --engine "$engine" "${exact[@]}" -f 'checks::*' -f 'shapes::*' -f main -- "$bin/shapes" 20
done
save jumps-inject --engine inject "${exact[@]}" -- "$bin/jumps" 5 3
save lines-uprobe --engine uprobe --lines -- "$bin/coverage" 4
save samples-uprobe --engine uprobe --overhead-budget 0 --sample 1000 -f burn -f nap -- "$bin/cpuwall" 30 3
PROFTAP_BLESS=1 cargo test --quiet -p proftap-tests --test golden
