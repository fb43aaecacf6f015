#!/usr/bin/env bash
# make-criu-bundle.sh: build a self-contained, relocatable CRIU bundle to
# carry to a machine that has no CRIU and no package registry (e.g. the GPU
# machine), then check that it works after being moved.
#
# usage: scripts/make-criu-bundle.sh [--no-test] [OUTDIR]
#   OUTDIR   default: .carry/criu in the repository (ignored by git)
#
# The bundle is made from the private prefix of scripts/install-criu.sh
# (GPUCR_CRIU_PREFIX, default /opt/gpucr/criu; that script is run first if
# the prefix is missing):
#   OUTDIR/bin/criu        launcher: finds its own directory and runs
#                          libexec/criu through lib/ld-linux-x86-64.so.2
#                          with --library-path lib (same launcher as the
#                          installed one; see install-criu.sh for why)
#   OUTDIR/libexec/criu    Debian forky's criu binary (4.2), unmodified
#   OUTDIR/lib/            the loader and every library criu loads (as listed
#                          by the loader itself) plus libgcc_s.so.1, which
#                          glibc loads on demand
#   OUTDIR/include/criu/   criu-plugin.h and the other libcriu-dev headers
#   OUTDIR/PACKAGES        Debian package names and versions it came from
#   OUTDIR/share/doc/      the packages' copyright files
# On the target: OUTDIR/bin/criu check; to make runc/go-criu use it, link
# it as criu into a directory early on PATH, e.g.
#   ln -sf "$PWD/.carry/criu/bin/criu" /usr/local/sbin/criu
#
# Test (skipped with --no-test): the bundle is copied to a fresh directory
# under /tmp, and from there scripts/criu-selftest.sh dumps and restores a
# shell loop (the dump kills it; after restore its counter must go on).
# Needs root.
set -euo pipefail

log() { printf '[criu-bundle] %s\n' "$*"; }
die() { printf '[criu-bundle] ERROR: %s\n' "$*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
PREFIX=${GPUCR_CRIU_PREFIX:-/opt/gpucr/criu}
LOADER_NAME=ld-linux-x86-64.so.2

test=1
out=
for a in "$@"; do
	case $a in
	--no-test) test=0 ;;
	-h | --help) sed -n '6,7s/^# \{0,1\}//p' "$0"; exit 0 ;;
	-*) die "unknown option $a" ;;
	*) [ -z "$out" ] || die "more than one OUTDIR"; out=$a ;;
	esac
done
out=${out:-$repo/.carry/criu}

# ------------------------------------------------------------- the source
if [ ! -x "$PREFIX/bin/criu" ] || [ ! -e "$PREFIX/libexec/criu" ]; then
	log "no private CRIU in $PREFIX: running scripts/install-criu.sh"
	"$here/install-criu.sh"
fi
if [ ! -x "$PREFIX/bin/criu" ] || [ ! -e "$PREFIX/libexec/criu" ] || [ ! -e "$PREFIX/lib/$LOADER_NAME" ]; then
	die "$PREFIX has no private CRIU (install-criu.sh found a working system CRIU instead?); the bundle needs it: GPUCR_CRIU_PRIVATE=1 scripts/install-criu.sh after moving the system criu off PATH"
fi

# ------------------------------------------------------------- build
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
new=$out.new.$$
trap 'rm -rf "$new"' EXIT
rm -rf "$new"
mkdir -p "$new/bin" "$new/libexec" "$new/lib" "$new/include" "$new/share/doc"
log "building the bundle from $PREFIX in $out"

cp "$PREFIX/bin/criu" "$new/bin/criu"
cp -L "$PREFIX/libexec/criu" "$new/libexec/criu"
cp -L "$PREFIX/lib/$LOADER_NAME" "$new/lib/$LOADER_NAME"
cp -a "$PREFIX/include/criu" "$new/include/"
cp "$PREFIX/PACKAGES" "$new/PACKAGES"

# The libraries criu loads, as the loader resolves them, copied under their
# soname (symlinks dereferenced).
listing=$("$PREFIX/lib/$LOADER_NAME" --list --library-path "$PREFIX/lib" "$PREFIX/libexec/criu")
mapfile -t sonames < <(printf '%s\n' "$listing" | awk '/=>/ && $1 !~ /^\// { print $1 }')
[ "${#sonames[@]}" -gt 0 ] || die "could not list criu's libraries"
for so in "${sonames[@]}" libgcc_s.so.1; do
	[ -e "$PREFIX/lib/$so" ] || die "$so is not in $PREFIX/lib"
	cp -L "$PREFIX/lib/$so" "$new/lib/$so"
done
while read -r pkg _; do
	c=$PREFIX/pkgroot/usr/share/doc/$pkg/copyright
	if [ -f "$c" ]; then
		mkdir -p "$new/share/doc/$pkg"
		cp "$c" "$new/share/doc/$pkg/"
	fi
done <"$PREFIX/PACKAGES"

# Everything criu loads must come from the bundle itself.
blist=$("$new/lib/$LOADER_NAME" --list --library-path "$new/lib" "$new/libexec/criu")
if printf '%s\n' "$blist" | grep -q 'not found' ||
	printf '%s\n' "$blist" | awk '/=>/ { print $3 }' | grep -qv "^$new/lib/"; then
	printf '%s\n' "$blist" >&2
	die "the bundle's criu resolves libraries outside the bundle"
fi

rm -rf "$out"
mv "$new" "$out"
trap - EXIT
log "bundle: $out ($(du -sh "$out" | cut -f1), $(find "$out/lib" -type f | wc -l) files in lib/), CRIU $(sed -n 's/^criu //p' "$out/PACKAGES")"

[ "$test" = 1 ] || exit 0

# ------------------------------------------------------------- test
[ "$(id -u)" -eq 0 ] || die "the test needs root (or use --no-test)"
tdir=$(mktemp -d /tmp/gpucr-criu-bundle-test.XXXXXX)
trap 'rm -rf "$tdir"' EXIT
cp -a "$out" "$tdir/criu"
log "test: bundle copied to $tdir/criu; a real dump and restore from there"
"$here/criu-selftest.sh" "$tdir/criu/bin/criu" || die "the bundle's CRIU fails the self-test"
log "test: OK (bundle works from $tdir/criu; removed)"
