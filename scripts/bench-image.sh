#!/usr/bin/env bash
# Image write/read throughput against plain files, in one run:
#
#   scripts/bench-image.sh [DIR] [SIZE_MB] [imagebench flags...]
#
# DIR (default: $TMPDIR or /tmp; /dev/shm measures memory, not a disk) is where
# the images and files go; SIZE_MB (default 256) is the data per case. Prints
# imagebench's table: image vs raw GB/s and their ratio per data kind, with the
# CPU count and DIR's filesystem.
#
# Runs build/bin/imagebench, built first when a Go toolchain is here (so it is
# never stale); the GPU machine has none, so there it runs the static binary
# `make` built (CGO_ENABLED=0 go build -o build/bin/imagebench ./image/cmd/imagebench)
# and that was copied along.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-${TMPDIR:-/tmp}}
size=${2:-256}
shift $(($# < 2 ? $# : 2))

bin=${IMAGEBENCH:-$root/build/bin/imagebench}
if command -v go >/dev/null 2>&1 && [[ -z ${IMAGEBENCH:-} ]]; then
	mkdir -p "$(dirname "$bin")"
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -o "$bin" ./image/cmd/imagebench)
fi
if [[ ! -x $bin ]]; then
	echo "bench-image.sh: $bin not found and no Go toolchain to build it;" \
		"build it elsewhere with: make imagebench" >&2
	exit 1
fi
if [[ ! -d $dir ]]; then
	echo "bench-image.sh: $dir is not a directory" >&2
	exit 2
fi

exec "$bin" -dir "$dir" -size "$size" "$@"
