# Helpers the benchmark scripts share; sourced, not run.

# The median of the numbers on standard input, one a line.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Downloads URL ($1), checks it against its SHA-256 ($2) and unpacks it
# into directory $3: nothing unchecked is built.
fetch_checked() {
    local file
    file=$(mktemp)
    curl -fsSL "$1" -o "$file" || { rm -f "$file"; echo "cannot download $1" >&2; return 1; }
    echo "$2  $file" | sha256sum -c --quiet - || { rm -f "$file"; echo "$1 is not the file expected (SHA-256 differs)" >&2; return 1; }
    tar xf "$file" -C "$3" || { rm -f "$file"; echo "cannot unpack $1" >&2; return 1; }
    rm -f "$file"
}

# A server a script measures while it serves: the script sets `out` (its
# directory), `server` (the server's job) and `serve FILE` (one benchmark
# run, its rates into FILE); the server logs to $out/server.log.

# Fails the script unless the server still runs, saying when it ended ($1).
server_runs() {
    kill -0 "$server" 2>/dev/null || { echo "the server ended $1:" >&2; cat "$out/server.log" >&2; exit 1; }
}

# Waits until the command given succeeds, 30 s at most, while the server runs.
wait_for() {
    local deadline=$((SECONDS + 30))
    until "$@"; do
        server_runs "while waiting for $*"
        [ "$SECONDS" -lt "$deadline" ] || { echo "no $* within 30 s" >&2; exit 1; }
        sleep 0.05
    done
}

# `serve` into file $1 while the rest of the arguments record the server
# in the background, once the check named second says it records; stops
# it as Ctrl-C does.
serve_under() {
    local rates=$1 recording=$2
    shift 2
    rm -f "$out/recorder.err"
    "$@" 2>"$out/recorder.err" >/dev/null &
    recorder=$!
    until "$recording"; do
        kill -0 "$recorder" 2>/dev/null || { cat "$out/recorder.err" >&2; exit 1; }
        sleep 0.05
    done
    serve "$rates"
    kill -INT "$recorder" 2>/dev/null || true
    # perf ends with the status of a command Ctrl-C stopped.
    local status=0
    wait "$recorder" || status=$?
    recorder=
    [ "$status" -eq 0 ] || [ "$status" -eq 130 ] || { echo "the recording failed ($status):" >&2; cat "$out/recorder.err" >&2; exit 1; }
}
recorder=

# Stops a recording `serve_under` left running (the script failed
# meanwhile), for the script's exit trap.
stop_recorder() {
    [ -z "$recorder" ] || { kill -INT "$recorder" 2>/dev/null || true; wait "$recorder" 2>/dev/null || true; }
}
proftap_attached() { grep -q "attached to process" "$out/recorder.err" 2>/dev/null; }
# perf starts with its events off (`-D -1 --control fifo:$out/control,$out/ack`),
# and says when it has turned them on.
perf_enabled() {
    timeout 30 sh -c 'echo enable >"$1"' enable "$out/control" || { echo "perf took no command within 30 s" >&2; exit 1; }
    local ack
    read -r -t 30 ack <"$out/ack" && [ "$ack" = ack ]
}
