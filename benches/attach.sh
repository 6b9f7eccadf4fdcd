#!/usr/bin/env bash
# A server attached to while it serves: Redis 7.0.15, built from its
# published sources at -O2 -g (its default), answering redis-benchmark's
# SET and GET requests (50 clients) on 127.0.0.1. Per round, in the same
# run: the requests per second bare, with `proftap attach` (the default:
# in-process engine, governor at 5%, sampling) and with `perf record -g -p`
# on the server; then the calls proftap counted of getCommand, which
# each GET request makes once.
#
# Redis imports pthread_cancel, and glibc loads libgcc_s, which unwinds a
# cancelled thread, only as it cancels one.
#
# Usage: benches/attach.sh [ROUNDS [REQUESTS]]   defaults 3, 200000 (root; perf installed)
# PROFTAP=path measures another build of proftap (default: this tree's release build).
# Sources and builds go to $PROFTAP_REALPROGS (default ~/.cache/proftap-realprogs).
set -euo pipefail

rounds=${1:-3}
requests=${2:-200000}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${PROFTAP_REALPROGS:-$HOME/.cache/proftap-realprogs}
mkdir -p "$dir"
if [ -z "${PROFTAP:-}" ]; then
    cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p proftap-cli
fi
proftap=${PROFTAP:-$root/target/release/proftap}
source "$root/benches/common.sh"
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 1; }

redis=$dir/redis-7.0.15/src
if [ ! -x "$redis/redis-server" ] || [ ! -x "$redis/redis-benchmark" ]; then
    rm -rf "$dir/redis-7.0.15"
    fetch_checked http://deb.debian.org/debian/pool/main/r/redis/redis_7.0.15.orig.tar.gz \
        4b1dc4ee6d622a09fff9c6777191209750fb5e5a725ef78ea012d6eef4c22982 "$dir"
    make -s -j2 -C "$dir/redis-7.0.15" BUILD_TLS=no >/dev/null
fi

out=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$redis/redis-server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$out/server.log" 2>&1 &
server=$!
trap 'stop_recorder; kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$out"' EXIT

answers() { "$redis/redis-cli" -p "$port" ping >/dev/null 2>&1; }
wait_for answers

# "SET GET" requests per second of one redis-benchmark run, into file $1.
serve() {
    "$redis/redis-benchmark" -p "$port" -q -n "$requests" -c 50 -t set,get 2>"$out/benchmark.err" | tr '\r' '\n' \
        | awk '/^SET: .* requests per second/ {s = $2} /^GET: .* requests per second/ {g = $2} END {print s, g}' >"$1"
    server_runs "during redis-benchmark"
    local sets gets
    read -r sets gets <"$1"
    [ -n "$sets" ] && [ -n "$gets" ] || { echo "redis-benchmark gave no rates:" >&2; cat "$out/benchmark.err" >&2; exit 1; }
}

mkfifo "$out/control" "$out/ack"

serve "$out/rates" # warm up: the keys exist, the allocator has its memory
printf '%-6s %18s %18s %18s %12s %10s\n' round 'bare SET/GET' 'proftap SET/GET' 'perf -g SET/GET' getCommand lost
for round in $(seq "$rounds"); do
    serve "$out/bare"
    serve_under "$out/ours" proftap_attached "$proftap" attach -o "$out/p.profile" "$server"
    serve_under "$out/perf" perf_enabled perf record -q --no-bpf-event -g -D -1 --control "fifo:$out/control,$out/ack" \
        -p "$server" -o "$out/perf.data"
    read -r bare_set bare_get <"$out/bare"
    read -r ours_set ours_get <"$out/ours"
    read -r perf_set perf_get <"$out/perf"
    counted=$("$proftap" report "$out/p.profile" --format json | python3 -c '
import json, sys
report = json.load(sys.stdin)
f = next(f for f in report["functions"] if f["name"] == "getCommand")
print(f["calls"] + (f.get("calls_after_throttle") or 0), report["lost"]["events"])')
    printf '%-6s %18s %18s %18s %12s %10s\n' "$round" "$bare_set/$bare_get" "$ours_set/$ours_get" "$perf_set/$perf_get" $counted
done
echo "getCommand: the calls counted, timed and after its probes were removed, against $requests GET requests"
