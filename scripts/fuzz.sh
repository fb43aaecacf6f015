#!/usr/bin/env bash
# Runs every fuzz target of the module (func FuzzXxx in a _test.go file) for
# the time given (default 20s each), one after the other: `go test -fuzz`
# takes one target of one package at a time. CI runs it briefly
# (scripts/run-tests.sh); `make fuzz FUZZTIME=10m` is the long run. A
# failure leaves its input under the package's testdata/fuzz/FuzzXxx/, where
# the plain test run replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-20s}
fail=0
n=0
while IFS=: read -r file name; do
	pkg=./$(dirname "$file")
	n=$((n + 1))
	echo "--- $name ($pkg, $fuzztime)"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"; then
		echo "FAIL: $name ($pkg)"
		fail=1
	fi
done < <(git ls-files '*_test.go' | xargs grep -oE '^func Fuzz[A-Za-z0-9_]+' | sed 's/func //' | sort)
if [ "$n" = 0 ]; then
	echo "no fuzz targets found"
	exit 1
fi
echo "$n fuzz targets run for $fuzztime each"
exit "$fail"
