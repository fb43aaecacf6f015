#!/usr/bin/env bash
# install-deps.sh: install everything `make test` and `make demo` need on a
# fresh Debian 12 (bookworm) machine. Run as root; non-interactive;
# idempotent: when everything is there already it only checks (no apt-get
# update, no download) and takes well under a second.
#
#  1. Debian packages (apt-get, only those missing, --no-install-recommends:
#     runc recommends Debian 12's criu 3.17, which cannot run on new kernels):
#       build-essential pkg-config    C toolchain (simulated driver, apps, plugin)
#       protobuf-compiler protobuf-c-compiler libprotobuf-c-dev
#                                     CRIU image / RPC protobufs
#       runc                          OCI runtime for the container tests
#       podman busybox-static         the podman test (tests/e2e/podman_test.go):
#                                     podman (conmon, containers-common come
#                                     with it; runc is its runtime, so Debian's
#                                     crun is not pulled in) runs a container
#                                     made from busybox-static's /bin/busybox
#       iproute2 procps util-linux psmisc
#                                     ip, ps/pgrep/pkill, setsid/nsenter, fuser
#       openssh-server openssh-client the migration test (tests/e2e/migrate_test.go):
#                                     an sshd in a second network namespace
#                                     is the target machine
#       python3                       scripts/oci-bundle.sh edits config.json
#       tar                           CRIU dumps tmpfs mounts (/dev/shm, /tmp)
#       clang-format cppcheck         `make lint-c`: the C sources' format and
#                                     static analysis (clang-format 14, cppcheck 2.10)
#  2. Go: expected in /usr/local/go; if `go` is not on PATH it is linked into
#     /usr/local/bin.
#  3. CRIU >= 4.2 and criu-plugin.h: scripts/install-criu.sh (a private
#     prefix with Debian forky's CRIU on Debian 12 and 13), which judges it
#     by a real dump and restore (scripts/criu-selftest.sh).
#  4. SeaweedFS's weed (Apache-2.0), the S3-compatible object store the tests
#     of images on a level run against (scripts/s3-server.sh): built from its
#     Go module at the version below into /usr/local/bin/weed (a few minutes,
#     once; `go install` refuses the module, whose go.mod has a replace
#     directive, so it is built in its own module directory).
set -euo pipefail

log() { printf '[install-deps] %s\n' "$*"; }
die() { printf '[install-deps] ERROR: %s\n' "$*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ "$(id -u)" -eq 0 ] || die "must run as root"
for t in dpkg-query apt-get; do
	command -v "$t" >/dev/null || die "this script is for Debian ($t not found)"
done

PKGS=(
	build-essential pkg-config
	protobuf-compiler protobuf-c-compiler libprotobuf-c-dev
	runc
	podman busybox-static
	iproute2 procps util-linux psmisc
	openssh-server openssh-client
	python3 tar
	clang-format cppcheck
)

# ------------------------------------------------------------------ step 1
missing=()
for p in "${PKGS[@]}"; do
	if [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" != "ii " ]; then
		missing+=("$p")
	fi
done
if [ "${#missing[@]}" -eq 0 ]; then
	log "step 1: all Debian packages are installed: ${PKGS[*]}"
else
	log "step 1: installing missing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt_opts=(-y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
	apt-get -q -o DPkg::Lock::Timeout=300 update
	apt-get "${apt_opts[@]}" install --no-install-recommends "${missing[@]}"
fi

# ------------------------------------------------------------------ step 2
if command -v go >/dev/null; then
	log "step 2: go on PATH: $(command -v go) ($(go version | cut -d' ' -f3))"
elif [ -x /usr/local/go/bin/go ]; then
	log "step 2: go is not on PATH: linking /usr/local/go/bin/{go,gofmt} into /usr/local/bin"
	ln -sf /usr/local/go/bin/go /usr/local/bin/go
	ln -sf /usr/local/go/bin/gofmt /usr/local/bin/gofmt
	hash -r
	command -v go >/dev/null || die "/usr/local/bin is not on PATH: add /usr/local/go/bin to PATH"
	log "    $(go version)"
else
	die "Go not found (expected in /usr/local/go): install Go from https://go.dev/dl/ into /usr/local/go"
fi

# ------------------------------------------------------------------ step 3
log "step 3: CRIU (scripts/install-criu.sh)"
"$here/install-criu.sh"

# ------------------------------------------------------------------ step 4
WEED_MODULE=github.com/seaweedfs/seaweedfs
WEED_VERSION=v0.0.0-20261109003541-7506e5f91cd6
weed_stamp=/usr/local/share/gpucr/weed.version
if [ -x /usr/local/bin/weed ] && [ "$(cat "$weed_stamp" 2>/dev/null)" = "$WEED_VERSION" ]; then
	log "step 4: SeaweedFS $WEED_VERSION in /usr/local/bin/weed"
else
	log "step 4: building SeaweedFS's weed $WEED_VERSION (once; a few minutes)"
	moddir=$(go mod download -json "$WEED_MODULE@$WEED_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$moddir" ] || die "go mod download $WEED_MODULE@$WEED_VERSION gave no module directory"
	tmp=$(mktemp -d)
	(cd "$moddir" && go build -trimpath -o "$tmp/weed" ./weed) || die "building weed failed"
	install -D -m 0755 "$tmp/weed" /usr/local/bin/weed
	rm -rf "$tmp"
	mkdir -p "$(dirname "$weed_stamp")"
	echo "$WEED_VERSION" >"$weed_stamp"
fi

criu=$(command -v criu) || die "criu is not on PATH after install-criu.sh"
log "done: gcc $(gcc -dumpfullversion), $(go version | cut -d' ' -f3), runc $(runc --version | sed -n 's/^runc version //p'), podman $(podman --version | sed -n 's/^podman version //p'), $(protoc --version), protoc-c $(protoc-c --version 2>&1 | sed -n 's/^protobuf-c //p'), criu $("$criu" --version | sed -n 's/^Version: //p') ($criu; dump/restore self-test passed), SeaweedFS $WEED_VERSION"
