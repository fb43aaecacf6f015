#!/usr/bin/env bash
# Everything CI runs (`make test` calls this after installing and building):
# static checks (Go, and the C sources: `make lint-c`), then every Go test
# (unit and end-to-end, with the race detector) through gotestsum, which ends
# with a pass/fail count, then a short run of every fuzz target
# (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:$PATH"
# go-nvml's cgo declares functions NVML has deprecated; its warnings are noise.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

fail=0
step() { printf '\n=== %s\n' "$*"; }

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "not gofmt-formatted:"; echo "$unformatted"; fail=1
fi

step "go vet"
go vet ./... || fail=1

step "C: clang-format and cppcheck (make lint-c)"
make --no-print-directory lint-c || fail=1

step "the object store for the tests of images on a level (scripts/s3-server.sh)"
s3dir=$(mktemp -d /tmp/gpucr-s3.XXXXXX)
trap 'kill -9 "$(cat "$s3dir/weed.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$s3dir"' EXIT
if GPUCR_TEST_S3_ENDPOINT=$(bash scripts/s3-server.sh "$s3dir"); then
	export GPUCR_TEST_S3_ENDPOINT
	echo "SeaweedFS's S3 server at $GPUCR_TEST_S3_ENDPOINT"
else
	echo "no object store: the level tests fail"
	fail=1
fi

step "go test -race ./... (unit and end-to-end)"
# End-to-end tests drive CRIU and runc, which need root; they run serially
# inside their package, packages in parallel.
mkdir -p build
if ! go tool gotestsum --format testname --jsonfile build/test-report.json -- \
	-race -count=1 -timeout 40m ./...; then
	fail=1
fi

step "fuzz: every fuzz target, briefly (make fuzz FUZZTIME=10m for a long run)"
bash scripts/fuzz.sh "${FUZZTIME:-20s}" || fail=1

if [ "$fail" != 0 ]; then
	echo "FAILED (see above)"
	exit 1
fi
echo "all checks passed"
