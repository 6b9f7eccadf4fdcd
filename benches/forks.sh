#!/usr/bin/env bash
# What following forked children costs: examples/children.c forks CHILDREN
# children one after another (each calls an instrumented function once, as
# the parent does before each fork) and prints the microseconds each took,
# fork to wait. Bare, under `proftap run -f work` (each child makes its
# memory and hands it over), the same with --no-follow-fork (children run
# unrecorded), `proftap run` (the default: every function, sampling) and
# `perf record -g`; the median of RUNS runs each.
# Usage: benches/forks.sh [CHILDREN [RUNS]]   defaults: 1000, 5. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
children=${1:-1000}
runs=${2:-5}
cargo build --release --quiet --bins
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
proftap=$PWD/target/release/proftap
gcc -O2 -g -o "$dir/children" examples/children.c

source benches/common.sh
measure() { for _ in $(seq "$runs"); do "$@" 2>/dev/null | grep -E '^[0-9.]+$' | tail -1; done | median; }

printf '%10s %14s %18s %14s %16s\n' bare 'proftap -f' '--no-follow-fork' 'proftap run' 'perf record -g'
bare=$(measure "$dir/children" "$children")
followed=$(measure "$proftap" run -f work -o "$dir/p.profile" -- "$dir/children" "$children")
unfollowed=$(measure "$proftap" run -f work --no-follow-fork -o "$dir/p.profile" -- "$dir/children" "$children")
default=$(measure "$proftap" run -o "$dir/p.profile" -- "$dir/children" "$children")
perf=-
if command -v perf >/dev/null; then
    perf=$(measure perf record -q -g -o "$dir/perf.data" -- "$dir/children" "$children")
fi
printf '%10s %14s %18s %14s %16s   (us per child)\n' "$bare" "$followed" "$unfollowed" "$default" "$perf"
