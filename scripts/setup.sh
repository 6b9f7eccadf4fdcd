#!/usr/bin/env bash
# Installs what building and testing proftap needs and a bare Debian or
# Ubuntu machine may lack: C and C++ compilers, binutils, and the peer tools
# the tests compare against or feed (valgrind, gcov, genhtml, gcovr, perf,
# go tool pprof, a debuginfod server, and speedscope in a headless Chromium
# for the timeline exports), and a real program's sources (Lua 5.4). Safe to
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
  [musl-gcc]=musl-tools
  [valgrind]=valgrind
  [gcov]=gcc
  [genhtml]=lcov
  [python3]=python3
  [perf]=linux-perf
  [go]=golang-go
  [tmux]=tmux
  [debuginfod]=debuginfod
  [chromium]=chromium
  [node]=nodejs
  [npm]=npm
  [curl]=curl
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

# speedscope (the viewer tests/timeline.rs opens the timeline exports in) and
# puppeteer-core (which drives Debian's chromium and downloads no browser; its
# 24.x versions still run on Debian's node 18) come from npm, into PROFTAP_NPM
# (by default ~/.cache/proftap-npm), where the tests look for them.
npm_dir=${PROFTAP_NPM:-$HOME/.cache/proftap-npm}
npm_packages=(speedscope@1.25.0 puppeteer-core@24.43.1)
npm_missing=()
for package in "${npm_packages[@]}"; do
  version=$(node -p "require('$npm_dir/node_modules/${package%@*}/package.json').version" 2>/dev/null || true)
  if [[ $version != "${package##*@}" ]]; then
    npm_missing+=("$package")
  fi
done
if ((${#npm_missing[@]})); then
  echo "setup: installing ${npm_missing[*]} into $npm_dir"
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error "${npm_packages[@]}" >/dev/null
fi

# Lua 5.4.4's published sources, which tests/lines.rs builds to compare line
# counts with gcov's on a real program, into PROFTAP_REALPROGS (by default
# ~/.cache/proftap-realprogs), where the tests and the benchmarks look.
lua_dir=${PROFTAP_REALPROGS:-$HOME/.cache/proftap-realprogs}/lua-5.4.4-src
if [[ ! -f $lua_dir/src/lvm.c ]]; then
  echo "setup: fetching Lua 5.4.4's sources into $lua_dir"
  "$(dirname "$0")/lua-sources.sh" "$lua_dir"
fi

command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is missing; install Rust from https://rustup.rs" >&2; exit 1; }
