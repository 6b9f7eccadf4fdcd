#!/usr/bin/env bash
# Where a recording's wall time goes around the program it records: from
# proftap's exec to the program's exec (reading symbols, planning), from
# the program's exec to its exit (held while patched, then running), and
# from its exit to proftap's (reading what was added up, writing the
# profile). Read from the kernel's sched_process_exec and _exit events
# (`perf record -a`), RUNS recordings in a row; one line each, in ms.
# Usage: benches/phases.sh RUNS [PROFTAP-RUN-FLAGS...] -- COMMAND [ARGS...]   (root)
# PROFTAP=path measures another build of proftap (default: this tree's release build).
set -euo pipefail
[ -z "${PROFTAP:-}" ] || PROFTAP=$(realpath "$PROFTAP")
cd "$(dirname "$0")/.."
[[ $# -ge 3 && $1 =~ ^[1-9][0-9]*$ ]] || { echo "usage: benches/phases.sh RUNS [FLAGS...] -- COMMAND [ARGS...]" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)" >&2; exit 1; }
runs=$1
shift
if [ -z "${PROFTAP:-}" ]; then
    cargo build --release --quiet --bins
fi
proftap=${PROFTAP:-$PWD/target/release/proftap}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
perf record -q -a -e sched:sched_process_exec,sched:sched_process_exit -o "$out/sched.data" -- \
    bash -c 'for _ in $(seq "$1"); do "$2" run -o "$3/p.profile" "${@:4}" >/dev/null 2>&1 </dev/null; done' \
    phases "$runs" "$proftap" "$out" "$@" 2>/dev/null
# proftap's exec starts a run; the next exec by another process is the
# program's; a run ends with the exit of proftap's main thread.
perf script -i "$out/sched.data" -F pid,tid,time,event,trace 2>/dev/null | awk -v proftap="$proftap" '
    /sched_process_exec/ && index($0, "filename=" proftap " ") { split($1, p, "/"); run = p[1]; start = $2; program = 0; next }
    /sched_process_exec/ && run && !program { split($1, p, "/"); if (p[1] != run) { program = p[1]; exec = $2 }; next }
    /sched_process_exit/ && run {
        split($1, p, "/")
        if (p[1] == program && p[2] == program) exited = $2
        if (p[1] == run && p[2] == run) {
            printf "before %6.1f   program %6.1f   after %6.1f   whole %6.1f\n", (exec - start) * 1000, (exited - exec) * 1000, ($2 - exited) * 1000, ($2 - start) * 1000
            run = 0
        }
    }'
