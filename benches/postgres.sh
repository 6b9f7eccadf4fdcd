#!/usr/bin/env bash
# A database server attached to while it serves: PostgreSQL 15.18, built
# from Debian's source archive at -O2 -g, answering pgbench's select-only
# transactions (4 clients, 2 threads, over a Unix socket). The server
# forks a backend for each client, and each backend runs each query
# through exec_simple_query. Per round, in the same run: transactions a
# second bare, with `proftap attach` to the postmaster (the default:
# in-process engine, governor at 5%, sampling; the backends it forks
# followed) and with `perf record -g -p` on it; then the calls proftap
# counted of exec_simple_query in every backend, against the transactions
# pgbench made (each one query; pgbench adds a few of its own).
#
# Usage: benches/postgres.sh [ROUNDS [TRANSACTIONS]]   defaults 3, 4000 a client (root; perf installed)
# PROFTAP=path measures another build of proftap (default: this tree's release build).
# Sources and builds go to $PROFTAP_REALPROGS (default ~/.cache/proftap-realprogs).
set -euo pipefail

rounds=${1:-3}
transactions=${2:-4000}
clients=4
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${PROFTAP_REALPROGS:-$HOME/.cache/proftap-realprogs}
mkdir -p "$dir"
if [ -z "${PROFTAP:-}" ]; then
    cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p proftap-cli
fi
proftap=${PROFTAP:-$root/target/release/proftap}
source "$root/benches/common.sh"
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 1; }

pg=$dir/pg
if [ ! -x "$pg/bin/postgres" ] || [ ! -x "$pg/bin/pgbench" ]; then
    rm -rf "$dir/postgresql-15.18" "$pg"
    fetch_checked http://deb.debian.org/debian/pool/main/p/postgresql-15/postgresql-15_15.18.orig.tar.bz2 \
        11df0df97fe3ea4ba9a791faaf39cee1d2fe571e78885b5b55d8517d27c323b4 "$dir"
    (cd "$dir/postgresql-15.18" && ./configure -q --prefix="$pg" --without-readline --without-zlib --without-icu CFLAGS="-O2 -g" >/dev/null)
    make -s -j2 -C "$dir/postgresql-15.18" >/dev/null
    make -s -C "$dir/postgresql-15.18" install >/dev/null
fi

# PostgreSQL refuses to run as root: it runs as nobody, from a copy of
# the build it can read, on a data directory of its own; its socket is
# in a directory only nobody (and root) can enter, as it trusts whoever
# connects.
out=$(mktemp -d)
server=
# The server's processes, found by the copy they run (its pid file may
# not be written yet).
stop_server() {
    [ -z "$server" ] || { pkill -f "^$out/pg/bin/postgres" || true; wait "$server" 2>/dev/null || true; }
}
trap 'stop_recorder; stop_server; rm -rf "$out"' EXIT
chmod 755 "$out"
cp -a "$pg" "$out/pg"
mkdir "$out/data" "$out/socket"
chown nobody "$out/data" "$out/socket"
chmod 700 "$out/socket"
as_server() { runuser -u nobody -- "$@"; }
as_server "$out/pg/bin/initdb" -D "$out/data" --no-sync -A trust -U bench >"$out/initdb.log" 2>&1 \
    || { cat "$out/initdb.log" >&2; exit 1; }
as_server "$out/pg/bin/postgres" -D "$out/data" -k "$out/socket" -c listen_addresses='' -c fsync=off >"$out/server.log" 2>&1 &
server=$!

pgbench() { as_server "$out/pg/bin/pgbench" -h "$out/socket" -U bench "$@" postgres; }
answers() { as_server "$out/pg/bin/pg_isready" -q -h "$out/socket" -U bench; }
wait_for answers
postmaster=$(head -1 "$out/data/postmaster.pid")
pgbench -i -q -s 4 >"$out/init.log" 2>&1 || { cat "$out/init.log" >&2; exit 1; }

# Transactions a second of one pgbench run, into file $1.
serve() {
    pgbench -n -S -c "$clients" -j 2 -t "$transactions" >"$out/bench.log" 2>&1 || { cat "$out/bench.log" >&2; exit 1; }
    server_runs "during pgbench"
    awk '/^tps = / {printf "%d\n", $3}' "$out/bench.log" >"$1"
    [ -s "$1" ] || { echo "pgbench gave no rate:" >&2; cat "$out/bench.log" >&2; exit 1; }
}

mkfifo "$out/control" "$out/ack"

serve "$out/rate" # warm up: the table in the server's buffers
printf '%-6s %8s %8s %8s %30s %10s %8s\n' round bare proftap 'perf -g' 'exec_simple_query' 'stubs' lost
for round in $(seq "$rounds"); do
    serve "$out/bare"
    serve_under "$out/ours" proftap_attached "$proftap" attach -o "$out/p.profile" "$postmaster"
    serve_under "$out/perf" perf_enabled perf record -q --no-bpf-event -g -D -1 --control "fifo:$out/control,$out/ack" \
        -p "$postmaster" -o "$out/perf.data"
    IFS='|' read -r calls how share lost < <("$proftap" report "$out/p.profile" --format json | python3 -c '
import json, sys
report = json.load(sys.stdin)
f = next(f for f in report["functions"] if f["name"] == "exec_simple_query")
after, stopped = f.get("calls_after_throttle"), f.get("calls_counted_until_stopped")
how = "exact" if f["mode"] != "throttled" or after is not None else "until counting stopped"
samples = report["samples"]
share = 100 * samples["in_counting_stubs"] / max(samples["total"], 1)
print("%d|%s|%.1f%%|%d" % (f["calls"] + (after or stopped or 0), how, share, report["lost"]["events"]))')
    printf '%-6s %8s %8s %8s %30s %10s %8s\n' "$round" "$(cat "$out/bare")" "$(cat "$out/ours")" "$(cat "$out/perf")" "$calls ($how)" "$share" "$lost"
done
echo "transactions a second; exec_simple_query: its calls counted, timed and after its probes were removed, against $((clients * transactions)) transactions; stubs: the samples in the counting stubs"
