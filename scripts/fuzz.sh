#!/usr/bin/env bash
# Fuzzes the parsers of proftap that read hostile input with AFL++, on stable
# Rust (cargo-afl). For each target in fuzz/src/bin: replays its committed
# corpus (fuzz/corpus/TARGET), then fuzzes it for SECONDS starting from that
# corpus. Fails, naming the target and the input, if afl finds a crash or a
# hang. Installs cargo-afl, and with it AFL++, when missing. See docs/FUZZING.md.
#
#   scripts/fuzz.sh [SECONDS [TARGET...]]    SECONDS per target, default 10
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-10}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: SECONDS must be a positive whole number, not '$seconds'" >&2; exit 1; }
shift $(($# > 0 ? 1 : 0))
if (($#)); then
  targets=("$@")
else
  # PROFTAP_FUZZ_SKIP names targets left out of a run over all of them: those
  # with known crashes that wait on a fix (docs/FUZZING.md lists them).
  mapfile -t targets < <(basename -s .rs fuzz/src/bin/*.rs | grep -vxF -f <(tr ' ' '\n' <<<"${PROFTAP_FUZZ_SKIP:-}" | grep .) || true)
fi

manifest=(--manifest-path fuzz/Cargo.toml --target-dir target/fuzz --locked)
out=target/fuzz/runs

# cargo-afl must match the afl crate the targets link, or its runtime does not fit.
version=$(awk '/^name = "afl"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' fuzz/Cargo.lock)
[[ -n $version ]] || { echo "fuzz: fuzz/Cargo.lock names no afl crate" >&2; exit 1; }
for tool in make cc; do
  command -v "$tool" >/dev/null 2>&1 ||
    { echo "fuzz: $tool is missing and cargo-afl needs it to build AFL++; run scripts/setup.sh" >&2; exit 1; }
done
if ! [[ $(cargo afl --version 2>/dev/null) =~ ^cargo-afl\ ${version//./\\.}($|\ ) ]]; then
  echo "fuzz: installing cargo-afl $version (it builds AFL++ too: about a minute)"
  cargo install --quiet --locked --force cargo-afl --version "$version" ||
    { echo "fuzz: cannot install cargo-afl $version from crates.io (see above)" >&2; exit 1; }
fi
# A new Rust toolchain needs the AFL++ runtime built again for it.
if cargo afl whatsup -h 2>&1 | grep -q 'was not built'; then
  cargo afl config --build >/dev/null || { echo "fuzz: cargo afl config --build could not build AFL++ (see above)" >&2; exit 1; }
fi

cargo afl build --release --quiet "${manifest[@]}"
# The corpus replayed without afl-fuzz first: a crash there is a regression.
cargo afl test --release --quiet "${manifest[@]}" --bins ||
  { echo "fuzz: a committed corpus input crashes its target (see above)" >&2; exit 1; }

# afl-fuzz refuses to start on a machine set up for other uses (CPU frequency
# scaling, core dumps piped to a handler, shared cores): none of it matters
# for finding crashes.
export AFL_NO_UI=1 AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_FAST_CAL=1
export TMPDIR=$PWD/target/fuzz/tmp
mkdir -p "$out" "$TMPDIR"
failed=()
for target in "${targets[@]}"; do
  [[ -f fuzz/src/bin/$target.rs && -d fuzz/corpus/$target ]] ||
    { echo "fuzz: no target '$target' (fuzz/src/bin/$target.rs and fuzz/corpus/$target/)" >&2; exit 1; }
  dict=()
  [[ -f fuzz/dict/$target.dict ]] && dict=(-x "fuzz/dict/$target.dict")
  rm -rf "${out:?}/$target"
  # -t: an input slower than a second is a hang; -m: allocating past 2 GiB is a crash.
  if ! cargo afl fuzz -V "$seconds" -t 1000 -m 2048 "${dict[@]}" -i "fuzz/corpus/$target" -o "$out/$target" \
    "target/fuzz/release/$target" >"$out/$target.log" 2>&1; then
    tail -n 20 "$out/$target.log" >&2
    echo "fuzz: afl-fuzz could not fuzz $target (its output is in $out/$target.log)" >&2
    failed+=("$target")
    continue
  fi
  field() { awk -v k="$1" '$1 == k { print $3 }' "$out/$target/default/fuzzer_stats"; }
  echo "fuzz: $target: $(field execs_done) executions in ${seconds}s, $(field corpus_count) inputs, $(field edges_found) of $(field total_edges) edges, $(field saved_crashes) crashes, $(field saved_hangs) hangs"
  found=0
  for input in "$out/$target"/default/{crashes,hangs}/id:*; do
    [[ -e $input ]] || continue
    # On a shared machine a stall of a second looks like a hang to afl: a
    # hang counts when a replay of it is slow too.
    if [[ $input == */hangs/* ]] && timeout 2 "target/fuzz/release/$target" <"$input" >/dev/null 2>&1; then
      echo "fuzz: $target: $input took over a second under afl but not when replayed (the machine stalled); not a hang"
      continue
    fi
    echo "fuzz: $target failed on $input (replay: target/fuzz/release/$target < '$input')" >&2
    found=1
  done
  ((found == 0)) || failed+=("$target")
done

echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
((${#failed[@]} == 0)) || { echo "fuzz: afl found crashes or hangs in ${failed[*]}" >&2; exit 1; }
