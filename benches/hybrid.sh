#!/usr/bin/env bash
# The hybrid default on a call-heavy program: examples/hot.c (-O2) calls a
# tiny function MILLIONS times and a cheap one 10 times, and prints how long
# its main took. Shown: that time bare, under the default mode (every
# function instrumented, the governor removes tiny's instrumentation, 1 kHz
# sampling) with each engine, and fully instrumented (--overhead-budget 0
# --no-sample) with each engine; median of RUNS runs each, same run.
# Usage: benches/hybrid.sh [MILLIONS [FULL_MILLIONS [RUNS]]]
#   defaults: 100 (bare and hybrid), 0.5 (full instrumentation, which is
#   far slower), 3. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
millions=${1:-100}
full_millions=${2:-0.5}
runs=${3:-3}
cargo build --release --quiet --bins
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
proftap=$PWD/target/release/proftap
gcc -O2 -g -o "$dir/hot" examples/hot.c

source benches/common.sh
# The program's own elapsed time, in ms.
elapsed() { for _ in $(seq "$runs"); do "$@" 2>&1 >/dev/null | awk '/^elapsed_ms/ {print $2}'; done | median; }

printf '%-40s %12s %12s %8s\n' mode millions main_ms ratio
for m in "$millions" "$full_millions"; do
  bare=$(elapsed "$dir/hot" "$m")
  printf '%-40s %12s %12s %8s\n' "bare" "$m" "$bare" 1.00
  for engine in inject uprobe; do
    hybrid=$(elapsed "$proftap" run --engine "$engine" -o "$dir/p.profile" -- "$dir/hot" "$m")
    printf '%-40s %12s %12s %8.2f\n' "hybrid default, --engine $engine" "$m" "$hybrid" "$(awk -v a="$hybrid" -v b="$bare" 'BEGIN {print a / b}')"
  done
  if [[ $m == "$full_millions" ]]; then
    for engine in inject uprobe; do
      full=$(elapsed "$proftap" run --engine "$engine" --overhead-budget 0 --no-sample -o "$dir/p.profile" -- "$dir/hot" "$m")
      printf '%-40s %12s %12s %8.2f\n' "fully instrumented, --engine $engine" "$m" "$full" "$(awk -v a="$full" -v b="$bare" 'BEGIN {print a / b}')"
    done
  fi
done
