#!/usr/bin/env bash
# How fast can chunk bytes get from pinned host memory into image files, and
# can the GPU copy straight into them? On the GPU machine:
#
#   bash tests/gpu/bench-store.sh TOOLS_DIR [DIR...]
#
# TOOLS_DIR holds filebench (`make tools` puts it in build/bin, static).
# For each DIR (default /dev/shm): filebench's table (one file per chunk as
# images store them, with fallocate, one file per thread, pwritev, mmap,
# O_DIRECT where the file system takes it) at 4, 8 and 16 threads, and for
# a tmpfs tests/gpu/dma-to-file.py (the GPU copying into a mapped file
# registered with cuMemHostRegister, against the pinned-buffer floor).
# GB (default 8) is the data per run. Tables in build/gpu/store (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
TOOLS=${1:?usage: bench-store.sh TOOLS_DIR [DIR...]}
shift
DIRS=${*:-/dev/shm}
GB=${GB:-8}
fresh_logs build/gpu/store

note_host
for d in $DIRS; do
	fs=$(stat -f -c %T "$d")
	ways=files,falloc,big,bigfalloc,writev,mmap
	[ "$fs" != tmpfs ] && ways=files,big,direct
	note ""
	timeout 240 "$TOOLS/filebench" -dir "$d" -size $((GB * 1024)) -threads 4,8,16 -runs 2 -ways "$ways" 2>&1 | tee -a "$LOGS/summary.txt"
	if [ "$fs" = tmpfs ]; then
		note ""
		timeout 120 python3 tests/gpu/dma-to-file.py --dir "$d" --gb "$GB" 2>&1 | tee -a "$LOGS/summary.txt"
	fi
done
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/store-summary.txt"
exit 0
