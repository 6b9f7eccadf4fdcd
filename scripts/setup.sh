#!/usr/bin/env bash
# Installs what building and testing proftap needs and a bare Debian or
# Ubuntu machine may lack: C and C++ compilers, binutils, and the peer tools
# the tests compare against or feed (valgrind, gcov, genhtml, gcovr, perf,
# go tool pprof, a debuginfod server). Safe to
# run again: it installs only what is missing.
set -euo pipefail

# command -> Debian package
declare -A needs=(
  [gcc]=gcc
  [g++]=g++
  [make]=make
  [nm]=binutils
  [objdump]=binutils
  [readelf]=binutils
  [objcopy]=binutils
  [strip]=binutils
  [valgrind]=valgrind
  [gcov]=gcc
  [genhtml]=lcov
  [python3]=python3
  [perf]=linux-perf
  [go]=golang-go
  [tmux]=tmux
  [debuginfod]=debuginfod
)

missing=()
for cmd in "${!needs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${needs[$cmd]}")
done

if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "setup: installing ${missing[*]}"
  sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# gcovr (reads gcov's JSON format) comes from PyPI.
if ! command -v gcovr >/dev/null 2>&1; then
  echo "setup: installing gcovr"
  python3 -m pip install --quiet --disable-pip-version-check gcovr 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages gcovr
  hash -r
fi

# junitparser (reads back `proftap check --junit` reports) comes from PyPI.
if ! python3 -c "import junitparser" >/dev/null 2>&1; then
  echo "setup: installing junitparser"
  python3 -m pip install --quiet --disable-pip-version-check junitparser 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages junitparser
fi

command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is missing; install Rust from https://rustup.rs" >&2; exit 1; }
