#!/usr/bin/env bash
# install-criu.sh: make CRIU >= 4.2 (and its plugin header criu-plugin.h)
# available, for gpucr's CRIU plugin and helper. Run as root. Idempotent: a
# second run only checks (a real dump and restore, a few seconds), prints
# what is there and changes nothing.
#
# Why 4.2: Debian 12's CRIU 3.17 cannot run on new kernels (it does not know
# the [vvar_vclock] mapping: "vdso: Unexpected rt vDSO area bounds"), and
# Debian 13's 4.1.1 hangs in every dump on Linux 6.18 (after the parasite's
# cure; `criu check` still says "Looks good"). 4.2 also has the plugin hook
# POST_FORKING. A CRIU is judged by scripts/criu-selftest.sh (a real dump
# and restore under a time limit), never by `criu check` alone.
#
# What it does:
#  1. If `criu` on PATH is >= 4.2, passes the self-test, and a criu-plugin.h
#     with the PAUSE_DEVICES / CHECKPOINT_DEVICES / RESUME_DEVICES_LATE /
#     POST_FORKING hooks is found (PREFIX/include, /usr/include or
#     /usr/local/include): nothing to do; it says so and prints the version
#     and header path. If the working criu lacks only the header, only the
#     header is installed (from libcriu-dev, into PREFIX/include).
#     A criu on PATH that is older or fails the self-test is shadowed by the
#     private one (step 3), which goes first on root's PATH.
#  2. Debian testing/unstable (forky, sid): the distribution's criu is new
#     enough; installs criu and libcriu-dev with apt-get, then self-tests it
#     (a failure falls through to step 3).
#  3. Every other Debian (12 bookworm, 13 trixie, older): installs Debian
#     forky's CRIU into a private prefix without touching the system's libc,
#     apt configuration or apt state:
#       a. a private apt setup in APT_DIR (default /var/lib/gpucr/apt): its
#          own apt.conf (used through APT_CONFIG, so not even the system's
#          /etc/apt/apt.conf.d is read), sources list for SUITE on the mirror
#          host this machine already uses, lists, cache and an empty dpkg
#          status file. Nothing is written to /etc/apt or /var/lib/apt, and
#          no package is installed with dpkg. The Release file's signature is
#          checked against debian-archive-keyring; its Valid-Until date is
#          not (Acquire::Check-Valid-Until false), because mirrors and
#          snapshots serve testing's Release files after they expire (seen:
#          sid's and forky's, 20 days past): the packages installed are
#          named and versioned in PREFIX/PACKAGES, and the self-test judges
#          the result.
#       b. apt-get update there, then apt-get download of criu and the
#          closure of its Depends in SUITE (libcompel1, libc6, libgnutls,
#          libnftables1, libnl-3, libnet1, libprotobuf-c1, libbsd0, libuuid1
#          and their own library deps), so every library comes from the same
#          release, plus libcriu-dev for the plugin header.
#       c. dpkg-deb -x of those packages into PREFIX/pkgroot (default PREFIX
#          /opt/gpucr/criu), and the headers into PREFIX/include/criu.
#       d. PREFIX/bin/criu: a small launcher that runs the real binary through
#          the prefix's own loader:
#            ld-linux-x86-64.so.2 --library-path PREFIX/lib[:$LD_LIBRARY_PATH]
#                                 --argv0 "$0" PREFIX/libexec/criu "$@"
#          and a symlink LINK_DIR/criu -> PREFIX/bin/criu (default LINK_DIR
#          /usr/local/sbin, ahead of /usr/sbin on root's PATH, so runc, podman
#          and go-criu, which exec "criu" from PATH, find it). An intact
#          PREFIX from an earlier run that passes the self-test is only
#          re-linked, not downloaded again.
#       e. checks the result (all libraries resolve inside the prefix, the
#          self-test) before it replaces a previous PREFIX.
#
# Why a loader launcher (and not patchelf or LD_LIBRARY_PATH):
#  - CRIU never re-executes itself: it forks for `criu swrk` requests, for
#    restore and for the page server, and execs only external tools (ip,
#    iptables/nft, tar, apparmor_parser, action scripts). So /proc/self/exe
#    being the loader is harmless; verified: check, dump, restore (also -d),
#    swrk dump/restore through go-criu, runc checkpoint/restore, and a plugin
#    with PAUSE_DEVICES / CHECKPOINT_DEVICES / RESUME_DEVICES_LATE hooks
#    loaded with --libdir (dlopen of the plugin and of its system libraries
#    works: the loader falls back to the system's ld.so.cache).
#  - --library-path applies to this process only: the tools CRIU execs run
#    with the system's loader and libraries, unlike with an exported
#    LD_LIBRARY_PATH. The caller's LD_LIBRARY_PATH is appended after the
#    prefix, so a plugin's dependencies can still come from it while CRIU's
#    own libc cannot be displaced.
#  - the binary stays byte-identical to Debian's, and the same launcher works
#    from any location (it finds its own directory), which is what
#    scripts/make-criu-bundle.sh ships. A patchelf'ed copy (interpreter and
#    DT_RPATH set to the prefix) passed the same tests, but PT_INTERP must be
#    an absolute path (no relocatable bundle) and patchelf is one more
#    package to install.
#  - the launcher ends in `exec`, so runc/go-criu see the pid they started
#    and the swrk socket (fd 3) and other inherited fds pass through.
#
# Notes:
#  - ps shows the running CRIU with comm "ld-linux-x86-64" and the loader's
#    command line (PREFIX/lib/ld-linux-x86-64.so.2 ... PREFIX/libexec/criu
#    ARGS): match it with pgrep -f libexec/criu, not pgrep criu.
#  - a caller's LD_PRELOAD is honoured by the loader: don't run criu with an
#    application's interposer preloaded.
#  - without CAP_SYS_RESOURCE CRIU logs "rlimit: Can't setup RLIMIT_NOFILE
#    for self: Operation not permitted" as an Error; it is harmless (gpucr's
#    CLI leaves it out of the errors it shows).
#
# Environment:
#   GPUCR_CRIU_PREFIX   private prefix           (default /opt/gpucr/criu)
#   GPUCR_APT_DIR       private apt directory    (default /var/lib/gpucr/apt)
#   GPUCR_CRIU_LINK_DIR where the criu symlink goes (default /usr/local/sbin)
#   GPUCR_DEBIAN_MIRROR Debian mirror URI (default: the one the system's
#                       own Debian source uses, else http://deb.debian.org/debian)
#   GPUCR_CRIU_SUITE    Debian suite to take CRIU from (default forky)
#   GPUCR_CRIU_PRIVATE  1: use the private prefix even where the distribution
#                       has a new enough CRIU (Debian-like amd64 systems with
#                       debian-archive-keyring)
set -euo pipefail

PREFIX=${GPUCR_CRIU_PREFIX:-/opt/gpucr/criu}
APT_DIR=${GPUCR_APT_DIR:-/var/lib/gpucr/apt}
LINK_DIR=${GPUCR_CRIU_LINK_DIR:-/usr/local/sbin}
SUITE=${GPUCR_CRIU_SUITE:-forky}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
MIN_VERSION=4.2
LOADER_NAME=ld-linux-x86-64.so.2
TRIPLET=x86_64-linux-gnu

log() { printf '[install-criu] %s\n' "$*"; }
warn() { printf '[install-criu] WARNING: %s\n' "$*" >&2; }
die() { printf '[install-criu] ERROR: %s\n' "$*" >&2; exit 1; }

# criu_version BIN: prints e.g. 4.1.1, or nothing if BIN does not run.
criu_version() {
	{ "$1" --version 2>/dev/null || true; } |
		sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1
}

# version_ge A B: true if version A >= B (dotted numbers).
version_ge() {
	[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

# new_enough BIN: BIN runs and is CRIU >= MIN_VERSION.
new_enough() {
	local v
	[ -x "$1" ] || return 1
	v=$(criu_version "$1")
	[ -n "$v" ] && version_ge "$v" "$MIN_VERSION"
}

# criu_ok BIN: BIN is CRIU >= MIN_VERSION and dumps and restores a process
# (scripts/criu-selftest.sh; its output goes to the log on failure).
criu_ok() {
	new_enough "$1" || return 1
	if ! "$here/criu-selftest.sh" -q -t 60 "$1" >"$selftest_log" 2>&1; then
		warn "$1 ($(criu_version "$1")) fails the dump/restore self-test:"
		sed 's/^/    /' "$selftest_log" >&2
		return 1
	fi
}

# find_header: prints the include directory whose criu/criu-plugin.h has
# the device hooks gpucr uses (Debian 12's criu package ships a 3.17 one in
# /usr/include/criu without them; 4.1's lacks POST_FORKING).
find_header() {
	local d h
	for d in "$PREFIX/include" /usr/include /usr/local/include; do
		h=$d/criu/criu-plugin.h
		if [ -f "$h" ] && grep -q CR_PLUGIN_HOOK__PAUSE_DEVICES "$h" &&
			grep -q CR_PLUGIN_HOOK__CHECKPOINT_DEVICES "$h" &&
			grep -q CR_PLUGIN_HOOK__RESUME_DEVICES_LATE "$h" &&
			grep -q CR_PLUGIN_HOOK__POST_FORKING "$h"; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# summary BIN INCDIR: the closing report (version, header; BIN passed the
# self-test before this is called).
summary() {
	local bin=$1 inc=$2
	log "criu: $bin -> $(readlink -f "$bin")"
	log "CRIU version: $(criu_version "$bin") (dumped and restored a test process)"
	log "criu-plugin.h: $inc/criu/criu-plugin.h (build plugins with -I$inc)"
	log "  its device hooks: $(grep -oE 'CR_PLUGIN_HOOK__([A-Z_]*DEVICES[A-Z_]*|POST_FORKING)' "$inc/criu/criu-plugin.h" | sort -u | tr '\n' ' ')"
	log "CRIU loads plugins from /usr/lib/criu/ by default (or criu --libdir DIR)"
}

# launcher_text DIR: the launcher for DIR/libexec/criu (version from
# DIR/PACKAGES).
launcher_text() {
	local v
	v=$(sed -n 's/^criu //p' "$1/PACKAGES" 2>/dev/null || true)
	cat <<EOF
#!/bin/sh
# CRIU launcher generated by gpucr scripts/install-criu.sh.
# Runs ../libexec/criu (Debian's CRIU ${v:-4.2+}) with the glibc and libraries
# in ../lib, through that glibc's own loader, wherever this directory is
# (links to this file are followed). Nothing is exported: programs that CRIU
# runs (ip, iptables, tar...) use the system's libraries. The caller's
# LD_LIBRARY_PATH is searched after ../lib.
self=\$(readlink -f -- "\$0") || exit 127
bin=\${self%/*}
root=\${bin%/*}
lib=\$root/lib
exec "\$lib/$LOADER_NAME" --library-path "\$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
	--argv0 "\$0" "\$root/libexec/criu" "\$@"
EOF
}

# write_launcher DIR: (re)writes DIR/bin/criu; false if already up to date.
write_launcher() {
	local dir=$1 text
	text=$(launcher_text "$dir")
	[ "$text" != "$(cat "$dir/bin/criu" 2>/dev/null)" ] || return 1
	mkdir -p "$dir/bin"
	printf '%s\n' "$text" >"$dir/bin/criu.tmp"
	chmod 755 "$dir/bin/criu.tmp"
	mv "$dir/bin/criu.tmp" "$dir/bin/criu"
}

[ "$(id -u)" -eq 0 ] || die "must run as root"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
selftest_log=$(mktemp /tmp/gpucr-install-criu-selftest.XXXXXX)
stage=
cleanup() {
	rm -f "$selftest_log"
	if [ -n "$stage" ]; then rm -rf "$stage"; fi
}
trap cleanup EXIT

# One install at a time (parallel make jobs, CI steps).
lockdir=/run/lock
[ -d "$lockdir" ] || lockdir=/tmp
exec 9>"$lockdir/gpucr-install-criu.lock"
if command -v flock >/dev/null && ! flock -w 600 9; then
	die "another install-criu.sh holds $lockdir/gpucr-install-criu.lock"
fi

# ------------------------------------------------------------------ step 1
log "step 1: looking for a working CRIU >= $MIN_VERSION on PATH"
header_only=0
# A launcher of ours written by an older version of this script: refresh it.
if [ -f "$PREFIX/PACKAGES" ] && [ -e "$PREFIX/libexec/criu" ] && write_launcher "$PREFIX"; then
	log "updated the launcher $PREFIX/bin/criu"
fi
if cur=$(command -v criu) && criu_ok "$cur"; then
	if inc=$(find_header); then
		log "criu $(criu_version "$cur") at $cur works and $inc/criu/criu-plugin.h exists: nothing to do"
		summary "$cur" "$inc"
		exit 0
	fi
	log "criu $(criu_version "$cur") at $cur works, but criu-plugin.h is missing: installing only the header"
	header_only=1
elif [ -n "${cur:-}" ]; then
	v=$(criu_version "$cur")
	log "criu at $cur (version ${v:-unknown}) is older than $MIN_VERSION or fails the self-test: installing CRIU >= $MIN_VERSION, which goes ahead of it on PATH"
else
	log "no criu on PATH: installing CRIU"
fi

# Which route: the distribution's packages, or the private prefix.
# shellcheck source=/dev/null
. /etc/os-release
route=
if [ "${GPUCR_CRIU_PRIVATE:-0}" = 1 ]; then
	route=private
elif [ "${ID:-}" = debian ]; then
	case ${VERSION_CODENAME:-} in
	buster | bullseye | bookworm | trixie) route=private ;;
	*) route=system ;;
	esac
else
	die "unsupported system (${PRETTY_NAME:-unknown}): install CRIU >= $MIN_VERSION and its criu-plugin.h yourself, or set GPUCR_CRIU_PRIVATE=1 on a Debian-like amd64 system"
fi

# ------------------------------------------------------------------ step 2
if [ "$route" = system ]; then
	export DEBIAN_FRONTEND=noninteractive
	if [ "$header_only" = 1 ]; then set -- libcriu-dev; else set -- criu libcriu-dev; fi
	log "step 2: ${PRETTY_NAME:-Debian}: apt-get install $*"
	apt-get update -q
	apt-get install -y -q --no-install-recommends "$@"
	hash -r
	cur=$(command -v criu) || die "criu not on PATH after apt-get install"
	if criu_ok "$cur" && inc=$(find_header); then
		summary "$cur" "$inc"
		exit 0
	fi
	warn "the distribution's criu ($(criu_version "$cur")) is older than $MIN_VERSION, fails the self-test or lacks its header: installing the private one"
	route=private
	header_only=0
fi

# ------------------------------------------------------------------ step 3
# Private prefix. Helpers first.

# link_criu: LINK_DIR/criu -> PREFIX/bin/criu; moves aside what is not ours.
link_criu() {
	local link=$LINK_DIR/criu target aside
	target=$(readlink -f "$PREFIX/bin/criu")
	mkdir -p "$LINK_DIR"
	if [ -L "$link" ] || [ -e "$link" ]; then
		if [ "$(readlink -f "$link")" = "$target" ]; then
			log "$link already points to $PREFIX/bin/criu"
			return 0
		fi
		if [ -L "$link" ]; then
			log "replacing the link $link -> $(readlink "$link")"
			rm -f "$link"
		else
			aside=$link.before-gpucr.$(date +%Y%m%d%H%M%S)
			warn "moving the existing $link aside to $aside"
			mv "$link" "$aside"
		fi
	fi
	ln -s "$PREFIX/bin/criu" "$link"
	log "linked $link -> $PREFIX/bin/criu"
}

# finish: make sure PATH finds our criu, then report.
finish() {
	local cur
	hash -r
	cur=$(command -v criu || true)
	if [ "$(readlink -f "${cur:-/nonexistent}")" != "$(readlink -f "$PREFIX/bin/criu")" ]; then
		warn "'criu' on this PATH is ${cur:-nothing}, not $LINK_DIR/criu: put $LINK_DIR first on PATH (runc also takes --criu $LINK_DIR/criu)"
		cur=$LINK_DIR/criu
	fi
	summary "$cur" "$(find_header)"
}

# system_mirror SUITE: first URI of an enabled deb source for exactly SUITE in
# the system's apt sources (one-line and deb822 formats).
system_mirror() {
	local suite=$1 f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk -v s="$suite" '
			$1 == "deb" {
				i = 2
				if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
				if ($(i + 1) == s) { print $i; exit }
			}' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk -v s="$suite" '
			function flush() {
				if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " s " ") &&
				    tolower(enabled) != "no" && uris != "") {
					split(uris, u, " "); print u[1]; found = 1
				}
				types = suites = uris = enabled = ""
			}
			/^[ \t]*$/ { flush(); if (found) exit; next }
			/^#/ { next }
			{
				key = tolower($1); val = $0
				sub(/^[^:]*:[ \t]*/, "", val)
				if (key == "types:") types = val
				else if (key == "suites:") suites = val
				else if (key == "uris:") uris = val
				else if (key == "enabled:") enabled = val
			}
			END { if (!found) flush() }' "$f"
	done
}

usable_uri() { case $1 in http://* | https://*) return 0 ;; *) return 1 ;; esac; }

# An intact prefix from an earlier run (only the link was lost): re-link.
if [ "$header_only" = 0 ] && criu_ok "$PREFIX/bin/criu" && [ -f "$PREFIX/include/criu/criu-plugin.h" ]; then
	log "step 3: $PREFIX already holds a working CRIU $(criu_version "$PREFIX/bin/criu"): only linking it"
	link_criu
	finish
	exit 0
fi

arch=$(dpkg --print-architecture 2>/dev/null || echo unknown)
[ "$arch" = amd64 ] || die "the private CRIU install supports amd64 only (this is $arch)"
for t in apt-get apt-cache dpkg-deb readlink awk; do
	command -v "$t" >/dev/null || die "$t not found"
done
[ -r "$KEYRING" ] || die "$KEYRING missing: apt-get install debian-archive-keyring"

mirror=${GPUCR_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(system_mirror "${VERSION_CODENAME:-bookworm}" | head -n1)
	usable_uri "$mirror" || mirror=http://deb.debian.org/debian
fi
mirror=${mirror%/}

if [ "$header_only" = 1 ]; then
	log "step 3: fetching criu-plugin.h from Debian '$SUITE' libcriu-dev into $PREFIX/include (private apt state in $APT_DIR)"
else
	log "step 3: installing Debian '$SUITE' CRIU into $PREFIX (private apt state in $APT_DIR)"
fi
log "  mirror: $mirror"

# --- 3a: private apt configuration
log "step 3a: private apt configuration $APT_DIR/apt.conf"
conf=$APT_DIR/apt.conf
mkdir -p "$APT_DIR"/etc/apt.conf.d "$APT_DIR"/etc/sources.list.d \
	"$APT_DIR"/etc/preferences.d "$APT_DIR"/etc/trusted.gpg.d \
	"$APT_DIR"/lists/partial "$APT_DIR"/cache/archives/partial \
	"$APT_DIR"/state "$APT_DIR"/log "$APT_DIR"/debs
touch "$APT_DIR/state/dpkg-status"
{
	echo "# Generated by gpucr scripts/install-criu.sh; used through APT_CONFIG only."
	echo "deb [signed-by=$KEYRING] $mirror $SUITE main"
} >"$APT_DIR/etc/sources.list.new"
mv "$APT_DIR/etc/sources.list.new" "$APT_DIR/etc/sources.list"
cat >"$conf.new" <<EOF
// Generated by gpucr scripts/install-criu.sh. Read through APT_CONFIG, that
// is before, and instead of, /etc/apt/apt.conf and /etc/apt/apt.conf.d, so
// no system apt configuration, source, key, list or state is used or written.
Dir::Etc::Main "$APT_DIR/etc/apt.conf";
Dir::Etc::Parts "$APT_DIR/etc/apt.conf.d";
Dir::Etc::SourceList "$APT_DIR/etc/sources.list";
Dir::Etc::SourceParts "$APT_DIR/etc/sources.list.d";
Dir::Etc::Preferences "$APT_DIR/etc/preferences";
Dir::Etc::PreferencesParts "$APT_DIR/etc/preferences.d";
Dir::Etc::Trusted "$APT_DIR/etc/trusted.gpg";
Dir::Etc::TrustedParts "$APT_DIR/etc/trusted.gpg.d";
Dir::State "$APT_DIR/state";
Dir::State::Lists "$APT_DIR/lists";
Dir::State::status "$APT_DIR/state/dpkg-status";
Dir::Cache "$APT_DIR/cache";
Dir::Cache::Archives "$APT_DIR/cache/archives";
Dir::Log "$APT_DIR/log";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
// Signatures are checked; the Release file's expiry is not (see the header).
Acquire::Check-Valid-Until "false";
EOF
mv "$conf.new" "$conf"
papt() { APT_CONFIG=$conf "$@"; }

# --- 3b: lists, dependency closure, download
log "step 3b: apt-get update (private lists in $APT_DIR/lists)"
if ! papt apt-get -q update >"$APT_DIR/log/update.log" 2>&1; then
	cat "$APT_DIR/log/update.log" >&2
	die "apt-get update for $SUITE failed (NO_PUBKEY? bookworm's debian-archive-keyring 2023.3+deb12u1 or later has the $SUITE keys)"
fi
grep -E '^(Get|Hit|Err|W:|E:)' "$APT_DIR/log/update.log" | sed 's/^/    /' || true

if [ "$header_only" = 1 ]; then
	pkgs=()
else
	# criu's run-time closure: Depends/Pre-Depends, recursively, all from SUITE.
	mapfile -t pkgs < <(papt apt-cache depends --recurse --no-recommends --no-suggests \
		--no-conflicts --no-breaks --no-replaces --no-enhances criu |
		grep -v -e '^ ' -e '^<' | sort -u)
	[ "${#pkgs[@]}" -gt 1 ] || die "could not resolve criu's dependencies in $SUITE"
fi
log "step 3b: downloading ${pkgs[*]+${pkgs[*]} }libcriu-dev"
debs=$APT_DIR/debs
rm -f "$debs"/*.deb
# apt drops privileges to _apt for downloads: let it write there.
if id _apt >/dev/null 2>&1; then chown _apt "$debs"; fi
(cd "$debs" && papt apt-get -q download "${pkgs[@]}" libcriu-dev) >"$APT_DIR/log/download.log" 2>&1 ||
	{ cat "$APT_DIR/log/download.log" >&2; die "apt-get download failed"; }

# --- 3c: unpack into a staging directory
stage=$PREFIX.new.$$
rm -rf "$stage"
mkdir -p "$stage/include"
log "step 3c: unpacking with dpkg-deb -x into $stage"
: >"$stage/PACKAGES"
for deb in "$debs"/*.deb; do
	name=$(dpkg-deb -f "$deb" Package)
	version=$(dpkg-deb -f "$deb" Version)
	printf '%s %s\n' "$name" "$version" >>"$stage/PACKAGES"
	case $name in
	libcriu-dev)
		dpkg-deb -x "$deb" "$stage/libcriu-dev"
		cp -a "$stage/libcriu-dev/usr/include/criu" "$stage/include/"
		rm -rf "$stage/libcriu-dev"
		continue
		;;
	esac
	dpkg-deb -x "$deb" "$stage/pkgroot"
done
sed 's/^/    /' "$stage/PACKAGES"
[ -f "$stage/include/criu/criu-plugin.h" ] || die "no criu-plugin.h in libcriu-dev"

if [ "$header_only" = 1 ]; then
	mkdir -p "$PREFIX/include"
	rm -rf "$PREFIX/include/criu"
	mv "$stage/include/criu" "$PREFIX/include/criu"
	log "installed the CRIU headers in $PREFIX/include/criu"
	cur=$(command -v criu)
	summary "$cur" "$(find_header)"
	exit 0
fi

libdir=pkgroot/usr/lib/$TRIPLET
[ -f "$stage/$libdir/$LOADER_NAME" ] || die "no $LOADER_NAME in the unpacked libc6"
[ -f "$stage/pkgroot/usr/sbin/criu" ] || die "no usr/sbin/criu in the unpacked criu package"
mkdir -p "$stage/bin" "$stage/libexec"
ln -s "$libdir" "$stage/lib"
ln -s ../pkgroot/usr/sbin/criu "$stage/libexec/criu"

# --- 3d: the launcher (make-criu-bundle.sh ships it unchanged)
log "step 3d: writing the launcher $PREFIX/bin/criu"
write_launcher "$stage" || true

# --- 3e: verify before replacing anything
log "step 3e: checking the staged CRIU"
v=$(criu_version "$stage/bin/criu")
[ -n "$v" ] || die "the staged criu does not run"
version_ge "$v" "$MIN_VERSION" || die "the staged criu is $v, older than $MIN_VERSION (GPUCR_CRIU_SUITE=$SUITE)"
listing=$("$stage/lib/$LOADER_NAME" --list --library-path "$stage/lib" "$stage/libexec/criu" 2>&1) ||
	die "cannot list criu's libraries: $listing"
stage_lib=$(readlink -f "$stage/lib")
outside=$(printf '%s\n' "$listing" | awk '/=>/ { print $3 }' | while read -r p; do
	case $(readlink -f "$p" || echo "$p") in "$stage_lib"/*) ;; *) echo "$p" ;; esac
done)
if printf '%s\n' "$listing" | grep -q 'not found' || [ -n "$outside" ]; then
	printf '%s\n' "$listing" >&2
	die "some of criu's libraries do not resolve inside the prefix: ${outside:-see above}"
fi
log "    all $(printf '%s\n' "$listing" | grep -c '=>') libraries resolve inside the prefix"
criu_ok "$stage/bin/criu" || die "the staged CRIU $v fails the dump/restore self-test (see above)"
log "    criu $v: dumped and restored a test process"

# Swap in: PREFIX is replaced as a whole (the launcher finds its own
# directory, so the rename is harmless).
if [ -e "$PREFIX" ] || [ -L "$PREFIX" ]; then
	rm -rf "$PREFIX.old"
	mv "$PREFIX" "$PREFIX.old"
fi
mv "$stage" "$PREFIX"
stage=
rm -rf "$PREFIX.old"
log "installed CRIU $v in $PREFIX (packages: $PREFIX/PACKAGES)"

link_criu
finish
