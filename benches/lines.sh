#!/usr/bin/env bash
# Line counts beside a --coverage build of the same source: the bare
# program, the same built with --coverage (gcov's own way), and
# `proftap run --lines` on the bare one, in the same minute.
#
#   benches/lines.sh [RUNS]     default 5; the median of each is printed
#
# Programs: examples/lineloop.c (20 M iterations, about 100 M line entries
# and 20 M turns of a one-line loop), and Lua 5.4 built from its published
# sources at -O0 and at -O2 running benches/realprogs/bench.lua
# (downloaded once into $PROFTAP_REALPROGS, default
# ~/.cache/proftap-realprogs, as
# benches/realprogs.sh does). "recorded" is the time the profile says the
# program ran under proftap; "whole" adds proftap's start-up and end.
# Then regions on Lua -O0 (its string table and table lookups): timed in
# process on bench.lua beside --lines alone, and on strings.lua (short)
# beside the same regions timed by uprobes on lines (--engine uprobe).
set -euo pipefail
runs=${1:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${PROFTAP_REALPROGS:-$HOME/.cache/proftap-realprogs}
proftap=$root/target/release/proftap
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p proftap-cli
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source "$root/benches/common.sh"
# Seconds a command takes, to the millisecond (`time`'s 10 ms steps moved
# lineloop's ratios by a fifth).
seconds() {
    local start end
    start=$(date +%s%N)
    "$@" >/dev/null 2>&1
    end=$(date +%s%N)
    echo "$(( (end - start) / 1000000 ))" | awk '{ printf "%.3f\n", $1 / 1000 }'
}
# The program's own time under proftap, from the profile, in seconds.
recorded() {
    "$proftap" report --format json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["recording"]["duration_ns"] / 1e9)'
}

compare() {
    local name=$1 bare=$2 cov=$3; shift 3
    local b c w r i
    # In turns, so that the machine's drift from minute to minute falls on all three.
    for i in $(seq "$runs"); do
        seconds "$bare" "$@" >>"$work/$name.bare"
        seconds "$cov" "$@" >>"$work/$name.cov"
        seconds "$proftap" run --lines -o "$work/$name.$i.profile" -- "$bare" "$@" >>"$work/$name.whole"
    done
    b=$(median <"$work/$name.bare")
    c=$(median <"$work/$name.cov")
    w=$(median <"$work/$name.whole")
    r=$(for i in $(seq "$runs"); do recorded "$work/$name.$i.profile"; done | median)
    printf '%-9s bare %.3f s, --coverage %.3f s (%.2fx), proftap run --lines %.3f s recorded (%.2fx), %.3f s whole (%.2fx)\n' \
        "$name" "$b" "$c" "$(echo "$c / $b" | bc -l)" "$r" "$(echo "$r / $b" | bc -l)" "$w" "$(echo "$w / $b" | bc -l)"
}

gcc -O0 -g -o "$work/loop" "$root/examples/lineloop.c"
(cd "$work" && gcc -O0 -g --coverage -o "$work/loop-cov" "$root/examples/lineloop.c")
compare lineloop "$work/loop" "$work/loop-cov" 20000000

mkdir -p "$dir"
"$root/scripts/lua-sources.sh" "$dir/lua-5.4.4-src"
# Builds by directory name: lua-NAME, with these flags.
for variant in "O0:-O0" "cov:-O0 --coverage" "O2:-O2" "O2-cov:-O2 --coverage"; do
    name=${variant%%:*} flags=${variant#*:}
    if [ ! -x "$dir/lua-$name/src/lua" ]; then
        rm -rf "$dir/lua-$name" && cp -r "$dir/lua-5.4.4-src" "$dir/lua-$name"
        ldflags=$([[ $flags == *--coverage* ]] && echo --coverage || true)
        make -s -C "$dir/lua-$name/src" linux CFLAGS="$flags -g -std=gnu99 -DLUA_COMPAT_5_3 -DLUA_USE_LINUX" MYLDFLAGS="$ldflags" >/dev/null 2>&1
    fi
done
compare lua "$dir/lua-O0/src/lua" "$dir/lua-cov/src/lua" "$root/benches/realprogs/bench.lua" 1
compare lua-O2 "$dir/lua-O2/src/lua" "$dir/lua-O2-cov/src/lua" "$root/benches/realprogs/bench.lua" 1

regions=(--region intern=lstring.c:188-215 --region search=lstring.c:195-202 --region create=lstring.c:204-214 --region getshort=ltable.c:756-769)
lua=$dir/lua-O0/src/lua
b=$(for _ in $(seq "$runs"); do seconds "$lua" "$root/benches/realprogs/bench.lua" 1; done | median)
l=$(for i in $(seq "$runs"); do seconds "$proftap" run --lines=lstring.c --lines=ltable.c -o "$work/l.$i.profile" -- "$lua" "$root/benches/realprogs/bench.lua" 1; done | median)
r=$(for i in $(seq "$runs"); do seconds "$proftap" run "${regions[@]}" -o "$work/r.$i.profile" -- "$lua" "$root/benches/realprogs/bench.lua" 1; done | median)
printf 'regions   lua bench.lua: bare %.3f s, --lines (2 files) %.3f s whole (%.2fx), 4 regions in process %.3f s whole (%.2fx)\n' \
    "$b" "$l" "$(echo "$l / $b" | bc -l)" "$r" "$(echo "$r / $b" | bc -l)"
i=$(seconds "$proftap" run "${regions[@]}" -o "$work/ri.profile" -- "$lua" "$root/benches/realprogs/strings.lua")
u=$(seconds "$proftap" run "${regions[@]}" --engine uprobe -o "$work/ru.profile" -- "$lua" "$root/benches/realprogs/strings.lua")
printf 'regions   lua strings.lua: 4 regions in process %.3f s whole, by uprobes on lines %.3f s whole (%.0fx)\n' "$i" "$u" "$(echo "$u / $i" | bc -l)"
