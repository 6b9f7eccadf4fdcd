#!/usr/bin/env bash
# Time to load the function and line index of a large binary, next to
# `nm -C` plus `readelf --debug-dump=decodedline` on the same file, same run.
# Usage: benches/symbols.sh [BINARY]   default: proftap's own debug build.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || { echo "install hyperfine (apt-get install hyperfine)" >&2; exit 1; }
cargo build --release --quiet --bins
binary=${1:-}
if [[ -z $binary ]]; then
  cargo build --quiet --bins
  binary=$(mktemp /tmp/proftap-bench.XXXXXX)
  cp target/debug/proftap "$binary"
  trap 'rm -f "$binary"' EXIT
fi
ls -l "$binary"
hyperfine -N --warmup 2 --runs 15 \
  "target/release/proftap symbols $binary -f * --lines" \
  "target/release/proftap symbols $binary -f *" \
  "nm -C $binary" \
  "readelf --debug-dump=decodedline $binary"
