#!/usr/bin/env bash
# Two gpucr builds on one GPU machine in one call, for a change that must
# leave behaviour and speed as they were (a refactoring, say):
#
#   bash tests/gpu/compare-builds.sh NEW BASE CRIU_BUNDLE ANCHOR_DIR [RUNS]
#
# NEW, BASE: scripts/make-gpucr-bundle.sh outputs (the change, and main
# before it); CRIU_BUNDLE and ANCHOR_DIR as for bench-criu.sh. For each build:
# the test applications' checksums under `gpucr run` (bench-interposer.sh,
# apps part). Then bench-criu.sh at 8 GB (PyTorch's work.py; TREE_GB=0) RUNS
# times per build (default 2), the builds alternating and the order swapped
# each round, so that the machine's drift falls on both alike; the anchor
# (CRIU + the driver checkpoint API) runs once, in the first.
# Summary in build/gpu/compare/summary.txt; with $OUT set, it and the logs
# (compare-logs.tgz) are copied there.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh # NVLink multicast off
NEW=${1:?usage: compare-builds.sh NEW BASE CRIU_BUNDLE ANCHOR_DIR [RUNS]}
BASE=${2:?usage}
CRIU=${3:?usage}
ANCHOR=${4:?usage}
RUNS=${5:-2}
L=${LOGS:-build/gpu/compare}
rm -rf "$L"
mkdir -p "$L"
S=$L/summary.txt
fail=0
prefix() { if [ "$1" = new ]; then echo "$NEW"; else echo "$BASE"; fi; }

for b in new base; do
	echo "## test applications, $b build ($(prefix $b))" >>"$S"
	OUT= LOGS=$L/apps-$b PARTS=apps bash tests/gpu/bench-interposer.sh "$(prefix $b)" >"$L/apps-$b.txt" 2>&1 || fail=1
	grep -E '^\||FAIL' "$L/apps-$b/summary.txt" >>"$S" 2>/dev/null || tail -5 "$L/apps-$b.txt" >>"$S"
	echo >>"$S"
done

for r in $(seq "$RUNS"); do
	order="new base"
	[ $((r % 2)) = 0 ] && order="base new"
	for b in $order; do
		d=$L/criu-$b-$r
		mkdir -p "$d"
		skip=
		[ -f "$L/anchor.txt" ] && cp "$L/anchor.txt" "$d/" && skip=1
		OUT= LOGS=$d SKIP_ANCHOR=$skip TREE_GB=0 bash tests/gpu/bench-criu.sh "$(prefix $b)" "$CRIU" "$ANCHOR" 8 >"$d.txt" 2>&1 || fail=1
		[ -f "$L/anchor.txt" ] || cp "$d/anchor.txt" "$L/anchor.txt" 2>/dev/null
		{
			echo "## bench-criu 8 GB, run $r, $b build"
			grep -E '^\| 8 |PCIe floor|FAIL|^host' "$d/summary.txt"
			echo
		} >>"$S"
	done
done
{
	echo "## anchor (once)"
	tail -n 8 "$L/anchor.txt" 2>/dev/null
	echo "result: $([ $fail = 0 ] && echo pass || echo FAIL)"
} >>"$S"
cat "$S"
if [ -n "${OUT:-}" ]; then
	cp "$S" "$OUT/compare-summary.txt"
	tar -czf "$OUT/compare-logs.tgz" -C "$(dirname "$L")" "$(basename "$L")" 2>/dev/null
fi
exit $fail
