#!/usr/bin/env bash
# Builds the Debian package of proftap: both binaries, their man pages, shell
# completions for bash, zsh and fish, and the systemd unit of proftapd.
# Usage: scripts/package.sh [--bin-dir DIR] [--out DIR] [--fast]
#   --bin-dir  take proftap and proftapd from DIR instead of a release build
#   --out      where the .deb goes (default target/debian)
#   --fast     compress quickly (gzip) rather than small (xz), for tests
# Prints the path of the .deb last.
set -euo pipefail
cd "$(dirname "$0")/.."

bin_dir=""
out=target/debian
compress=(-Zxz)
while (($#)); do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compress=(-Zgzip -z1); shift ;;
    *) echo "package: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [[ -z $bin_dir ]]; then
  cargo build --release --quiet --bins
  bin_dir=target/release
fi
command -v dpkg-deb >/dev/null || { echo "package: dpkg-deb is missing (Debian's dpkg package)" >&2; exit 1; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

scripts/install.sh --prefix /usr --destdir "$stage" --bin-dir "$bin_dir" >/dev/null
install -D -m 0644 packaging/proftapd.service "$stage/lib/systemd/system/proftapd.service"
install -D -m 0644 README.md "$stage/usr/share/doc/proftap/README.md"
install -D -m 0644 docs/FORMAT.md "$stage/usr/share/doc/proftap/FORMAT.md"
install -D -m 0644 docs/PROTOCOL.md "$stage/usr/share/doc/proftap/PROTOCOL.md"

installed_kb=$(du -sk "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: proftap
Version: $version
Architecture: $arch
Maintainer: proftap developers <proftap@users.noreply.github.com>
Installed-Size: $installed_kb
Depends: libc6
Recommends: binutils
Section: devel
Priority: optional
Homepage: https://github.com/proftap/proftap
Description: exact call counts, per-call costs and line counts of unmodified programs
 proftap profiles C, C++ and Rust programs without recompiling them: it
 launches a command or attaches to a running process, places kernel uprobes
 at function entries and returns, and reports exact calls, inclusive and
 exclusive wall, CPU and counter costs, call trees, gcov-compatible line
 counts and sampled stacks. proftapd runs profiling sessions for local users.
CONTROL

mkdir -p "$out"
deb="$out/proftap_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$stage" "$deb" >/dev/null
echo "$deb"
