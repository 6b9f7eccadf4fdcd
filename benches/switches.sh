#!/usr/bin/env bash
# What a recording costs a program that switches threads often:
# examples/pingpong.c hands a byte between two threads on one CPU through
# two pipes ROUNDS times (two context switches a round trip, as a server
# answering a client on one CPU) and prints a round trip's microseconds.
# Bare; under perf record with only its sideband (-e dummy), and with a
# record at every switch (--switch-events); under `proftap run` (the
# default: in-process engine, sampling), --no-instrument and --no-sample.
# RUNS runs of each, interleaved; prints each one's fastest and median.
# Usage: benches/switches.sh [ROUNDS [RUNS]]   defaults: 200000, 5. Needs root.
# PROFTAP=path measures another build of proftap.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-200000}
runs=${2:-5}
[ -n "${PROFTAP:-}" ] || cargo build --release --quiet -p proftap-cli
proftap=${PROFTAP:-$PWD/target/release/proftap}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O2 -g -pthread -o "$dir/pingpong" examples/pingpong.c
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 1; }

names=(bare 'perf -e dummy' 'perf --switch-events' 'proftap run' '--no-instrument' '--no-sample')
commands=(
    ""
    "perf record -q --no-bpf-event -e dummy -o $dir/perf.data --"
    "perf record -q --no-bpf-event -e dummy --switch-events -o $dir/perf.data --"
    "$proftap run -o $dir/p.profile --"
    "$proftap run --no-instrument -o $dir/p.profile --"
    "$proftap run --no-sample -o $dir/p.profile --"
)
declare -a times
for _ in $(seq "$runs"); do
    for i in "${!names[@]}"; do
        # Word splitting of the command is wanted: no argument has spaces.
        # shellcheck disable=SC2086
        t=$(${commands[$i]} "$dir/pingpong" "$rounds" 2>"$dir/err" | awk '/round trips/ {print $4}') \
            || { echo "${names[i]} failed:" >&2; cat "$dir/err" >&2; exit 1; }
        times[i]="${times[i]:-} $t"
    done
done
for i in "${!names[@]}"; do
    sorted=$(echo ${times[i]} | tr ' ' '\n' | sort -n)
    printf '%-22s fastest %6s us   median %6s us\n' "${names[i]}" "$(echo "$sorted" | head -1)" "$(echo "$sorted" | sed -n "$(( (runs + 1) / 2 ))p")"
done
