#!/usr/bin/env bash
# Fetches Lua 5.4.4's published sources (Debian's copy of the release
# tarball, checked against the release's SHA-256) into DIR, once.
#
#   scripts/lua-sources.sh DIR
#
# The line-count tests compare proftap with gcov on them, and the
# benchmarks measure them; both build their own copies.
set -euo pipefail
dir=${1:?usage: scripts/lua-sources.sh DIR}
[ -f "$dir/src/lvm.c" ] && exit 0
url=http://deb.debian.org/debian/pool/main/l/lua5.4/lua5.4_5.4.4.orig.tar.gz
sha256=164c7849653b80ae67bec4b7473b884bf5cc8d2dca05653475ec2ed27b9ebf61
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL "$url" -o "$tmp/lua.tar.gz"
echo "$sha256  $tmp/lua.tar.gz" | sha256sum -c --quiet - || { echo "lua-sources: $url is not Lua 5.4.4's release" >&2; exit 1; }
mkdir -p "$tmp/src" && tar xzf "$tmp/lua.tar.gz" -C "$tmp/src" --strip-components=1
mkdir -p "$(dirname "$dir")" && rm -rf "$dir" && mv "$tmp/src" "$dir"
