#!/usr/bin/env bash
# What recording a command costs when its binaries' DWARF was kept by an
# earlier recording, and when it was not: the bare command, `proftap run`
# with nothing kept (the kept directory replaced by a file for that run)
# and `proftap run` reading what was kept, interleaved, RUNS runs each;
# prints the sorted whole-command times of each. Extra `proftap run` flags
# go in PROFTAP_ARGS (say --no-sample).
# Usage: benches/startup.sh RUNS COMMAND [ARGS...]   (root)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 && $1 =~ ^[1-9][0-9]*$ ]] || { echo "usage: benches/startup.sh RUNS COMMAND [ARGS...]" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "run as root: the kept directory compared is root's, /run/proftap/proftap-reads" >&2; exit 1; }
runs=$1
shift
cargo build --release --quiet --bins
proftap=$PWD/target/release/proftap
kept=/run/proftap/proftap-reads
aside=$(mktemp -d)
out=$(mktemp -d)
# The kept directory is put back whatever happens.
restore() {
  [[ -f $kept ]] && rm -f "$kept"
  [[ -d $aside/kept ]] && mv "$aside/kept" "$kept"
  rm -rf "$aside" "$out"
}
trap restore EXIT
"$proftap" run -o "$out/p.profile" -- "$@" >/dev/null 2>&1 </dev/null || true
seconds() {
  local start end
  start=$(date +%s%N)
  "$@" >/dev/null 2>&1 </dev/null || true
  end=$(date +%s%N)
  echo "$(((end - start) / 1000000))"
}
declare -A times
for _ in $(seq "$runs"); do
  times[bare]+="$(seconds "$@") "
  [[ -d $kept ]] && mv "$kept" "$aside/kept"
  touch "$kept"
  # shellcheck disable=SC2086
  times[none]+="$(seconds "$proftap" run ${PROFTAP_ARGS:-} -o "$out/p.profile" -- "$@") "
  rm -f "$kept"
  [[ -d $aside/kept ]] && mv "$aside/kept" "$kept"
  # shellcheck disable=SC2086
  times[kept]+="$(seconds "$proftap" run ${PROFTAP_ARGS:-} -o "$out/p.profile" -- "$@") "
done
for what in bare none kept; do
  echo "$what (ms): $(tr ' ' '\n' <<<"${times[$what]}" | grep . | sort -n | tr '\n' ' ')"
done
