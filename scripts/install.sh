#!/usr/bin/env bash
# Installs proftap from a source build, as `make install` would: both
# binaries, their man pages and shell completions for bash, zsh and fish.
# Usage: scripts/install.sh [--prefix DIR] [--destdir DIR] [--bin-dir DIR]
#   --prefix   where (default /usr/local): DIR/bin, DIR/share/man, ...
#   --destdir  stage under DIR instead of / (packaging)
#   --bin-dir  take proftap and proftapd from DIR instead of a release build
# proftapd's systemd unit is in packaging/proftapd.service.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
destdir=""
bin_dir=""
while (($#)); do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --destdir) destdir=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    *) echo "install: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [[ -z $bin_dir ]]; then
  cargo build --release --quiet --bins
  bin_dir=target/release
fi
root=$destdir$prefix

install -D -m 0755 "$bin_dir/proftap" "$root/bin/proftap"
install -D -m 0755 "$bin_dir/proftapd" "$root/bin/proftapd"
# Line tables serve backtraces while developing; an installation does without.
if command -v strip >/dev/null; then
  strip --strip-debug "$root/bin/proftap" "$root/bin/proftapd"
fi
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT
"$bin_dir/proftap" __generate-docs "$docs"
"$bin_dir/proftapd" __generate-man "$docs/man"
for page in "$docs"/man/*.1; do
  install -D -m 0644 "$page" "$root/share/man/man1/$(basename "$page")"
done
install -D -m 0644 "$docs/man/proftapd.8" "$root/share/man/man8/proftapd.8"
gzip -9nf "$root"/share/man/man1/proftap*.1 "$root"/share/man/man8/proftapd.8
install -D -m 0644 "$docs/completions/proftap.bash" "$root/share/bash-completion/completions/proftap"
zsh_dir=$root/share/zsh/site-functions
[[ $prefix == /usr ]] && zsh_dir=$root/share/zsh/vendor-completions
install -D -m 0644 "$docs/completions/_proftap" "$zsh_dir/_proftap"
install -D -m 0644 "$docs/completions/proftap.fish" "$root/share/fish/vendor_completions.d/proftap.fish"
echo "install: proftap installed under ${destdir}${prefix}"
