#!/usr/bin/env bash
# Real programs built from their published sources at -O2 -g, profiled by
# proftap beside perf and callgrind in the same run: an interpreter (Lua
# 5.4.4 running benches/realprogs/bench.lua), a database engine (SQLite
# 3.40.1's shell running benches/realprogs/bench-sql.sh's 100 000 inserts and
# queries), a compressor (gzip 1.13 on SQLite's C source), a C++ parser
# (yaml-cpp 0.6.3's parse tool reading and writing back a YAML document),
# a shell that forks (dash 0.5.12 running benches/realprogs/fork.sh, its
# children counted in every process) and a multi-threaded Rust program
# (ripgrep searching a source tree, then a larger part of the machine),
# a second interpreter (CPython 3.13.5 running benches/realprogs/bench.py)
# and a multi-threaded C compressor (xz 5.8.1 compressing with two threads).
#
# Usage: benches/realprogs.sh [RUNS]     (root; perf, valgrind and cmake installed)
# Sources and builds go to $PROFTAP_REALPROGS (default ~/.cache/proftap-realprogs).
#
# Prints, per program: the median of RUNS whole-command times of the bare
# program, `proftap run` (the default: in-process engine, governor at 5%,
# sampling) and `perf record -g`, with events lost; the five hottest
# functions by exclusive CPU (proftap) and by self samples (perf); then, with
# every probe kept (`--overhead-budget 0`) on a smaller input, the call counts
# of the functions checked against callgrind's.
set -euo pipefail

runs=${1:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${PROFTAP_REALPROGS:-$HOME/.cache/proftap-realprogs}
proftap=$root/target/release/proftap
source "$root/benches/common.sh"
mkdir -p "$dir"
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p proftap-cli
for tool in perf valgrind callgrind_annotate cmake; do
    command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install linux-perf valgrind cmake" >&2; exit 1; }
done

pool=http://deb.debian.org/debian/pool/main
lua=$dir/lua-5.4.4/src/lua
if [ ! -x "$lua" ]; then
    "$root/scripts/lua-sources.sh" "$dir/lua-5.4.4-src"
    rm -rf "$dir/lua-5.4.4" && cp -r "$dir/lua-5.4.4-src" "$dir/lua-5.4.4"
    make -s -C "$dir/lua-5.4.4" linux MYCFLAGS=-g MYLDFLAGS=-g >/dev/null
fi
sqlite=$dir/sqlite/build/sqlite3
if [ ! -x "$sqlite" ]; then
    # The release tarball unpacks into sqlite3-3.40.1/.
    rm -rf "$dir/sqlite" "$dir/sqlite3-3.40.1"
    fetch_checked "$pool/s/sqlite3/sqlite3_3.40.1.orig.tar.xz" \
        aaa776260ab4dc976db34aa7891819484c8676b5b2783123ebc6301e2ca5d655 "$dir"
    mv "$dir/sqlite3-3.40.1" "$dir/sqlite"
    mkdir -p "$dir/sqlite/build"
    (cd "$dir/sqlite/build" && ../configure --disable-tcl --enable-shared=no CFLAGS="-O2 -g" >/dev/null && make -s sqlite3 >/dev/null)
fi
gzip=$dir/gzip-1.13/gzip
if [ ! -x "$gzip" ]; then
    rm -rf "$dir/gzip-1.13"
    fetch_checked "$pool/g/gzip/gzip_1.13.orig.tar.xz" \
        7454eb6935db17c6655576c2e1b0fabefd38b4d0936e0f87f48cd062ce91a057 "$dir"
    (cd "$dir/gzip-1.13" && ./configure CFLAGS="-O2 -g" >/dev/null && make -s >/dev/null)
fi
yaml=$dir/yaml-cpp/build/util/parse
if [ ! -x "$yaml" ]; then
    # The release tarball unpacks into yaml-cpp-yaml-cpp-0.6.3/.
    rm -rf "$dir/yaml-cpp" "$dir/yaml-cpp-yaml-cpp-0.6.3"
    fetch_checked "$pool/y/yaml-cpp/yaml-cpp_0.6.3.orig.tar.gz" \
        77ea1b90b3718aa0c324207cb29418f5bced2354c2e483a9523d98c3460af1ed "$dir"
    mv "$dir/yaml-cpp-yaml-cpp-0.6.3" "$dir/yaml-cpp"
    cmake -S "$dir/yaml-cpp" -B "$dir/yaml-cpp/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-O2 -g" \
        -DYAML_CPP_BUILD_TESTS=OFF -DYAML_CPP_BUILD_TOOLS=ON >/dev/null
    make -s -C "$dir/yaml-cpp/build" parse >/dev/null
fi
rg=$dir/rg/bin/rg
if [ ! -x "$rg" ]; then
    CARGO_PROFILE_RELEASE_DEBUG=true cargo install --quiet --locked ripgrep@15.2.0 --root "$dir/rg" --target-dir "$dir/rg-target"
fi
dash=$dir/dash-0.5.12/src/dash
if [ ! -x "$dash" ]; then
    rm -rf "$dir/dash-0.5.12"
    fetch_checked "$pool/d/dash/dash_0.5.12.orig.tar.gz" \
        6a474ac46e8b0b32916c4c60df694c82058d3297d8b385b74508030ca4a8f28a "$dir"
    (cd "$dir/dash-0.5.12" && ./configure CFLAGS="-O2 -g" >/dev/null && make -s >/dev/null)
fi
python=$dir/python/python
if [ ! -x "$python" ]; then
    # The release tarball unpacks into Python-3.13.5/.
    rm -rf "$dir/python" "$dir/Python-3.13.5"
    fetch_checked "$pool/p/python3.13/python3.13_3.13.5.orig.tar.xz" \
        93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640 "$dir"
    mv "$dir/Python-3.13.5" "$dir/python"
    (cd "$dir/python" && ./configure --quiet CFLAGS="-O2 -g" >/dev/null && make -s -j"$(nproc)" python >/dev/null 2>&1)
fi
xz=$dir/xz-5.8.1/src/xz/xz
if [ ! -x "$xz" ]; then
    rm -rf "$dir/xz-5.8.1"
    fetch_checked "$pool/x/xz-utils/xz-utils_5.8.1.orig.tar.xz" \
        0b54f79df85912504de0b14aec7971e3f964491af1812d83447005807513cd9e "$dir"
    (cd "$dir/xz-5.8.1" && ./configure --quiet CFLAGS="-O2 -g" --disable-shared >/dev/null && make -s -j"$(nproc)" >/dev/null 2>&1)
fi
sql=$dir/bench.sql
[ -s "$sql" ] || bash "$root/benches/realprogs/bench-sql.sh" >"$sql"
# A source tree to search: ripgrep's sources and the crates its lock file
# and this repository's name (those fetched for Linux; building proftap
# fetches the latter), copied once: the registry grows with whatever else
# cargo fetches.
tree=$dir/rg-tree
if [ ! -d "$tree" ]; then
    registry=${CARGO_HOME:-$HOME/.cargo}/registry/src
    lock=$(ls -d "$registry"/*/ripgrep-15.2.0 | head -1)/Cargo.lock
    rm -rf "$tree.part" && mkdir -p "$tree.part"
    awk '/^name = /{ n = $3 } /^version = /{ gsub(/"/, "", n); gsub(/"/, "", $3); print n "-" $3 }' "$lock" "$root/Cargo.lock" |
        sort -u | while read -r crate; do
            for d in "$registry"/*/"$crate"; do
                if [ -d "$d" ]; then cp -r "$d" "$tree.part/" && break; fi
            done
        done
    mv "$tree.part" "$tree"
fi

# Seconds a command takes (to the millisecond), median of $runs after one
# run not counted (this VM's page cache is reclaimed within minutes: a
# search's first run reads its files from disk), its output discarded.
seconds_median() {
    "$@" >/dev/null 2>&1 </dev/null || true
    local start end
    for _ in $(seq "$runs"); do
        start=$(date +%s%N)
        "$@" >/dev/null 2>&1 </dev/null || true
        end=$(date +%s%N)
        awk -v ns="$((end - start))" 'BEGIN { printf "%.3f\n", ns / 1e9 }'
    done | sort -n | awk '{ t[NR] = $1 } END { print t[int((NR + 1) / 2)] }'
}

compare_py=$root/benches/realprogs/compare.py

proftap_top() {
    "$proftap" report "$1" --format json >"$1.json"
    python3 "$compare_py" top "$1.json"
    # Of the throttled functions, how many calls the report gives exact, estimated, or counted in part (N+?).
    "$proftap" report "$1" --no-pager 2>/dev/null | awk '
        /^Throttled functions/ { table = 1; getline; next }
        table && /^$/ { table = 0 }
        table { if ($1 ~ /\+\?$/) unknown++; else if ($1 ~ /^~/) estimated++; else exact++ }
        END { printf "  throttled: %d with calls exact, %d estimated, %d counted in part (N+?)\n", exact, estimated, unknown }'
    # The flame graph's stacks with a frame that names no function.
    "$proftap" export "$1" --format folded -o "$1.folded"
    awk '{n = $NF; all += n} /\[unknown/ {unnamed += n} END {printf "  flame graph: %.2f%% of %d samples under an unnamed frame\n", all ? 100 * unnamed / all : 0, all}' "$1.folded"
}

perf_top() {
    perf report -i "$1" --no-children -g none --sort sym --stdio -q 2>/dev/null | grep '%' | sed 's/^ */    /' >"$1.top" || true
    head -5 "$1.top"
}

compare() {
    local name=$1
    shift
    local out=$dir/$name
    echo "== $name: $*"
    local bare proftap_s perf_s
    bare=$(seconds_median "$@")
    proftap_s=$(seconds_median "$proftap" run -o "$out.profile" -- "$@")
    # Without BPF events (proftap records none): perf 6.1's thread for
    # them waits out a second's poll at the end on newer kernels, a second
    # that is not sampling's cost.
    perf_s=$(seconds_median perf record -q --no-bpf-event -g -o "$out.perf" -- "$@")
    awk -v b="$bare" -v p="$proftap_s" -v f="$perf_s" \
        'BEGIN { printf "  bare %.3f s   proftap run %.3f s (%.2fx)   perf record -g %.3f s (%.2fx)\n", b, p, p / b, f, f / b }'
    echo "  proftap, exclusive CPU (measured, and estimated after a throttle):"
    proftap_top "$out.profile"
    echo "  perf, self samples:"
    perf_top "$out.perf"
}

# Calls of each function, by proftap with every probe kept and by callgrind,
# each run by the command in the array `around` (none unless set).
around=()
exact() {
    local name=$1 functions=$2
    shift 2
    local out=$dir/$name-exact
    local args=()
    for f in ${functions//,/ }; do args+=(-f "$f"); done
    ${around[@]+"${around[@]}"} "$proftap" run --overhead-budget 0 --no-sample "${args[@]}" -o "$out.profile" -- "$@" >/dev/null </dev/null 2>&1
    ${around[@]+"${around[@]}"} valgrind -q --tool=callgrind --callgrind-out-file="$out.callgrind" "$@" >/dev/null </dev/null 2>&1
    echo "  every probe kept, against callgrind:"
    "$proftap" report "$out.profile" --format json >"$out.json"
    python3 "$compare_py" calls "$out.callgrind" "$functions" "$out.json"
}

# The same for a program that forks, in every process: callgrind zeroes a
# child's counters when it enters `zero_at`, the first function the child
# runs alone (callgrind's out file of a child holds its parent's counts up
# to the fork).
exact_children() {
    local name=$1 functions=$2 zero_at=$3
    shift 3
    local out=$dir/$name-exact
    local args=()
    for f in ${functions//,/ }; do args+=(-f "$f"); done
    "$proftap" run --overhead-budget 0 --no-sample "${args[@]}" -o "$out.profile" -- "$@" >/dev/null </dev/null 2>&1
    rm -rf "$out.callgrind.d" && mkdir "$out.callgrind.d"
    valgrind -q --tool=callgrind --trace-children=yes --zero-before="$zero_at" \
        --callgrind-out-file="$out.callgrind.d/callgrind.%p" "$@" >/dev/null </dev/null 2>&1
    echo "  every probe kept, against callgrind, all processes:"
    "$proftap" report "$out.profile" --format json >"$out.json"
    python3 "$compare_py" calls "$out.callgrind.d" "$functions" "$out.json"
}

compare lua "$lua" "$root/benches/realprogs/bench.lua" 2
exact lua luaH_getshortstr,luaS_new,luaV_execute,luaD_precall,luaH_newkey,luaC_step,luaF_close,luaH_resize \
    "$lua" "$root/benches/realprogs/bench.lua" 1
compare sqlite "$sqlite" :memory: -init "$sql" .quit
exact sqlite sqlite3VdbeExec,sqlite3_step,sqlite3BtreeInsert,sqlite3VdbeHalt,sqlite3Malloc,sqlite3GetToken \
    "$sqlite" :memory: -init "$sql" .quit
# What gzip compresses: SQLite's amalgamation (C source, 8 MB) five times.
text=$dir/gzip-input
[ -s "$text" ] || for _ in 1 2 3 4 5; do cat "$dir/sqlite/build/sqlite3.c"; done >"$text"
compare gzip "$gzip" -6 -c "$text"
head -c 3000000 "$text" >"$text.small"
exact gzip longest_match,send_bits,bi_reverse,updcrc,flush_block,fill_window,ct_tally,pqdownheap \
    "$gzip" -6 -c "$text.small"
# Two threads each compressing blocks of the same text (6 MB of it).
# rc_encode's calls may move by one with the threads' timing, bare too:
# callgrind once counted 44,597 where four other runs of it and three of
# proftap counted 44,598.
xz_input=$dir/xz-input
head -c 6000000 "$text" >"$xz_input"
head -c 300000 "$text" >"$xz_input.small"
compare xz "$xz" -T2 -6 --block-size=1MiB -c "$xz_input"
exact xz bt_find_func,lzma_lzma_optimum_normal,lzma_mf_bt4_find,get_literal_price,rc_encode,bt_skip_func,move_pos,length \
    "$xz" -T2 -6 --block-size=100KiB -c "$xz_input.small"
yaml_input=$dir/yaml-input
[ -s "$yaml_input" ] || python3 "$root/benches/realprogs/yaml-input.py" 6000 >"$yaml_input"
[ -s "$yaml_input.small" ] || python3 "$root/benches/realprogs/yaml-input.py" 600 >"$yaml_input.small"
compare yaml "$yaml" "$yaml_input"
exact yaml "YAML::Scanner::ScanNextToken(),YAML::Scanner::EnsureTokensInQueue(),YAML::Stream::eat(int),YAML::Stream::get(),\
YAML::detail::memory::create_node(),YAML::NodeBuilder::Pop(),YAML::Scanner::ScanPlainScalar(),YAML::Exp::Break()" \
    "$yaml" "$yaml_input.small"
# A shell forking for each subshell and command substitution, which run
# in the children: every process counted. callgrind counts each child from
# its fork on once its counters are zeroed as the child starts (dash's
# forkchild); otherwise a child's counts hold its parent's up to the fork.
compare dash "$dash" "$root/benches/realprogs/fork.sh"
exact_children dash evaltree,evalcommand,expandarg,forkshell,stalloc,evalsubshell,exitshell,evalbackcmd \
    forkchild.constprop.0 "$dash" "$root/benches/realprogs/fork.sh"
compare rg "$rg" -c 'fn [a-z_]+\(' "$tree"
# Functions called once per file, directory or glob, whatever thread runs
# them: a line buffer's calls depend on what its thread searched before
# (it grows and stays grown), so they differ from run to run, bare too.
exact rg ignore::walk::should_skip_entry,globset::glob::Parser::push_token,ignore::dir::Ignore::matched_dir_entry,\
termcolor::BufferWriter::print,encoding_rs_io::util::PossibleBom::encoding,\
ignore::dir::Ignore::add_child_path_with_found_ignore_files,ignore::dir::Ignore::add_child_with_entries,\
globset::glob::char_to_escaped_literal \
    "$rg" -c 'fn [a-z_]+\(' "$tree"
# CPython, isolated from the user's site and variables (-I -S), its
# hashes seeded alike and its addresses the same from run to run
# (PYTHONHASHSEED, setarch -R): what it computes then depends only on its
# environment, which it copies into os.environ. Valgrind sets four
# variables, set for both runs (valgrind changes their values, not their
# number; LD_PRELOAD names a library loaded anyway). The functions checked
# are those whose calls depend on neither (a dictionary lookup's depend on
# where objects lie, which each engine's own mappings move).
compare python "$python" -I -S "$root/benches/realprogs/bench.py" 4
around=(setarch -R env PYTHONHASHSEED=0 LD_PRELOAD=/lib/x86_64-linux-gnu/libc.so.6 LD_LIBRARY_PATH=/usr/lib/debug
    GLIBCXX_FORCE_NEW=1 GLIBCPP_FORCE_NEW=1)
exact python _PyEval_EvalFrameDefault,_PyEvalFramePushAndInit,_PyObject_Malloc,_PyObject_Free,\
clear_slots,PyLong_FromLong,PyDict_SetItem,list_dealloc \
    "$python" -I -S "$root/benches/realprogs/bench.py" 1
around=()
# The same search over more of the machine, long enough that proftap's
# start and end (reading ripgrep's DWARF, patching its functions) weigh
# less.
compare rg-large "$rg" -c 'fn [a-z_]+\(' "$tree" /usr/share /usr/include /usr/lib
