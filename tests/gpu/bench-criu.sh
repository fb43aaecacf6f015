#!/usr/bin/env bash
# Whole-process checkpoint and restore through CRIU: gpucr (plugin + helper)
# against the anchor (CRIU + the driver checkpoint API), same workload, same
# call:
#
#   bash tests/gpu/bench-criu.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB...]
#
# GPUCR_PREFIX: scripts/make-gpucr-bundle.sh output (bin/gpucr, lib/libgpucr.so,
# lib/criu/gpucr_plugin.so); CRIU_BUNDLE: scripts/make-criu-bundle.sh output;
# ANCHOR_DIR: a copy of the shared anchor (run-anchor.sh, work.py, drvckpt.c).
# For each size (default 8): the anchor's own script, then work.py under
# `gpucr run`: `gpucr checkpoint PID -D DIR` (CRIU dump with the plugin; the
# process ends), `gpucr restore -D DIR`, the time from the restore's start to
# the first heartbeat after it, and whether the checksum goes on advancing.
# Images in /dev/shm. Logs in build/gpu/criu (and $OUT).
#
# Also measured in the same call: the PCIe floor (pinned 4 GiB copies with
# PyTorch, each direction), against which the GPU copy of the dump and the
# load of the restore (the `"gpu"` numbers of `gpucr checkpoint/restore
# --json`) are given as ratios.  WAIT_MODES="spin block" repeats gpucr's part
# with the helper's lanes spinning (GPUCR_HELPER_WAIT=spin, the driver's default) and in blocking sync
# (GPUCR_HELPER_WAIT=block). TREE_GB=N (default 2; 0: off) adds a process tree:
# a shell with two work.py of N GB each under one `gpucr run`, dumped and
# restored as a whole, each process's heartbeat checked.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: bench-criu.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB...]"
prefix_criu_args "$usage" "$@"
A=${3:?$usage}
shift 3
SIZES=${*:-8}
PLUGINS=$(cd "$G/lib/criu" && pwd)
LOGS=${LOGS:-build/gpu/criu}
IMG=${IMG:-/dev/shm/gpucr-criu-img}
PY=${PYTHON:-python3}
# Not fresh_logs: compare-builds.sh puts the anchor's log (anchor.txt) in
# LOGS before it calls this with SKIP_ANCHOR, and it must stay.
mkdir -p "$LOGS"
: >"$LOGS/summary.txt"
use_criu "$C" || exit 1

note_host
note ""
note "## anchor: CRIU + driver checkpoint API (shared/device/anchor/run-anchor.sh)"
if [ -z "${SKIP_ANCHOR:-}" ]; then
	bash "$A/run-anchor.sh" "$GPUCR_CRIU" $SIZES >"$LOGS/anchor.txt" 2>&1 || bad "anchor script failed"
fi
sed 's/^/    /' "$LOGS/anchor.txt" | tail -n 8 | tee -a "$LOGS/summary.txt"

note ""
pcie_floor
note "PCIe floor, this run (pinned 4 GiB, best of 3): device->host $DTOH GB/s, host->device $HTOD GB/s"

SOCK=/run/gpucr/helper.sock
mkdir -p /run/gpucr
HELPER=
start_helper() {
	GPUCR_HELPER_WAIT=$1 "$GPUCR" helper --socket "$SOCK" --log-level info >"$LOGS/helper-$1.log" 2>&1 &
	HELPER=$!
	for _ in $(seq 100); do "$GPUCR" status --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done
}
trap 'kill $HELPER 2>/dev/null; pkill -f "$A/work.py" 2>/dev/null; rm -rf "$IMG"' EXIT
trap 'exit 143' TERM INT

# gpu FIELD FILE: a number from the "gpu" object of a --json report.
gpu() { $PY -c "import json,sys; l=[x for x in open(sys.argv[2]) if x.startswith('{')]; g=(json.loads(l[-1]) if l else {}).get('gpu') or {}; print(g.get(sys.argv[1], 0))" "$1" "$2"; }
# copyinfo FILE FLOOR_GBPS: "seconds (GB/s, x floor)" of a report's GPU copy.
copyinfo() { $PY -c "
import sys; s=float(sys.argv[1]); b=float(sys.argv[2]); f=float(sys.argv[3])
print(f'{s:.3f} s ({b/1e9/s:.1f} GB/s, {s/(b/1e9/f):.2f}x floor)' if s > 0 else 'n/a')" "$(gpu seconds "$1")" "$(gpu bytes "$1")" "$2"; }
for MODE in ${WAIT_MODES:-spin}; do
kill $HELPER 2>/dev/null; wait $HELPER 2>/dev/null
start_helper "$MODE"
note ""
note "## gpucr: gpucr checkpoint / gpucr restore (CRIU with gpucr_plugin.so), helper lanes: $MODE"
note "| GB | dump total | GPU copy in the dump | image | restore (criu) | GPU load in the restore | restore to next heartbeat | checksum advancing after |"
note "|---|---|---|---|---|---|---|---|"
for gb in $SIZES; do
	L=$(cd "$LOGS" && pwd)/work-$gb.log
	rm -f "$L" && rm -rf "$IMG"
	setsid "$GPUCR" run --socket "$SOCK" -- $PY "$A/work.py" "$gb" "$L" </dev/null >"$LOGS/work-$gb.out" 2>&1 &
	for _ in $(seq 900); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
	P=$(grep -o 'pid=[0-9]*' "$L" | head -1 | cut -d= -f2)
	if [ -z "$P" ]; then
		bad "$gb GB: the workload did not start: $(tail -3 "$LOGS/work-$gb.out")"
		continue
	fi
	sleep 1
	t0=$(now)
	"$GPUCR" checkpoint "$P" -D "$IMG" --plugin-dir "$PLUGINS" --socket "$SOCK" --json >"$LOGS/ckpt-$gb.txt" 2>&1 || bad "$gb GB: checkpoint: $(tail -2 "$LOGS/ckpt-$gb.txt")"
	t1=$(now)
	size=$(du -sb "$IMG" | cut -f1)
	n0=$(hbs "$L")
	sleep 0.5
	t2=$(now)
	"$GPUCR" restore -D "$IMG" --plugin-dir "$PLUGINS" --socket "$SOCK" --json >"$LOGS/restore-$gb.txt" 2>&1 || bad "$gb GB: restore: $(tail -2 "$LOGS/restore-$gb.txt")"
	t3=$(now)
	t4=$(next_heartbeat "$L" "$n0")
	adv=no
	[ -n "$t4" ] && adv=$(checksum_advancing "$L")
	[ $adv = yes ] || bad "$gb GB: no advancing heartbeat after the restore"
	note "| $gb | $(span "$t0" "$t1") | $(copyinfo "$LOGS/ckpt-$gb.txt" "$DTOH") | $((size / 1000000)) MB | $(span "$t2" "$t3") | $(copyinfo "$LOGS/restore-$gb.txt" "$HTOD") | $([ -n "$t4" ] && span "$t2" "$t4" || echo never) | $adv |"
	cp "$IMG/dump.log" "$LOGS/dump-$MODE-$gb.log" 2>/dev/null
	cp "$IMG/restore.log" "$LOGS/restore-$MODE-$gb.log" 2>/dev/null
	cp "$LOGS/ckpt-$gb.txt" "$LOGS/ckpt-$MODE-$gb.txt"; cp "$LOGS/restore-$gb.txt" "$LOGS/restore-$MODE-$gb.txt"
	pkill -f "$A/work.py" 2>/dev/null
	sleep 1
done
done

# A process tree: one gpucr run of a shell that starts two work.py; both are
# gpucr clients; one dump (one GPU image), one restore.
TREE_GB=${TREE_GB:-2}
if [ "$TREE_GB" != 0 ]; then
	note ""
	note "## process tree: sh + 2 x work.py $TREE_GB GB under one gpucr run"
	T=$(cd "$LOGS" && pwd)
	rm -f "$T"/tree-*.log && rm -rf "$IMG"
	setsid "$GPUCR" run --socket "$SOCK" -- sh -c "$PY $A/work.py $TREE_GB $T/tree-1.log & $PY $A/work.py $TREE_GB $T/tree-2.log & wait" </dev/null >"$LOGS/tree.out" 2>&1 &
	ROOT=$!
	for _ in $(seq 900); do grep -q '^ready' "$T/tree-1.log" 2>/dev/null && grep -q '^ready' "$T/tree-2.log" 2>/dev/null && break; sleep 0.1; done
	sleep 1
	"$GPUCR" status --socket "$SOCK" >"$LOGS/tree-status.txt" 2>&1
	"$GPUCR" checkpoint "$ROOT" -D "$IMG" --plugin-dir "$PLUGINS" --socket "$SOCK" --json >"$LOGS/tree-ckpt.txt" 2>&1 || bad "tree: checkpoint: $(tail -2 "$LOGS/tree-ckpt.txt")"
	n1=$(hbs "$T/tree-1.log"); n2=$(hbs "$T/tree-2.log")
	# The dumped processes must be reaped before their pids can be restored
	# (the python ones were orphans: init reaps them, sometimes late).
	for p in $(grep -o 'pid=[0-9]*' "$T"/tree-*.log | cut -d= -f2) $ROOT; do
		for _ in $(seq 100); do [ -e /proc/$p ] || break; sleep 0.1; done
	done
	bufs=$("$GPUCR" image inspect "$IMG" 2>/dev/null | grep -c '^process ' || true)
	"$GPUCR" restore -D "$IMG" --plugin-dir "$PLUGINS" --socket "$SOCK" --json >"$LOGS/tree-restore.txt" 2>&1 || bad "tree: restore: $(tail -2 "$LOGS/tree-restore.txt")"
	sleep 3
	m1=$(hbs "$T/tree-1.log"); m2=$(hbs "$T/tree-2.log")
	res=ok
	{ [ "$m1" -gt "$n1" ] && [ "$m2" -gt "$n2" ]; } || { res=FAIL; bad "tree: heartbeats after restore: $n1->$m1, $n2->$m2"; }
	note "| processes in the GPU image | dump | restore | heartbeats before -> 3 s after restore | result |"
	note "|---|---|---|---|---|"
	note "| $bufs | $(copyinfo "$LOGS/tree-ckpt.txt" "$DTOH") | $(copyinfo "$LOGS/tree-restore.txt" "$HTOD") | $n1->$m1, $n2->$m2 | $res |"
	"$GPUCR" image inspect "$IMG" >"$LOGS/tree-inspect.txt" 2>&1
	cp "$IMG/dump.log" "$LOGS/tree-dump.log" 2>/dev/null
	cp "$IMG/restore.log" "$LOGS/tree-restore.log" 2>/dev/null
	pkill -f "$A/work.py" 2>/dev/null
fi
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/criu-summary.txt" && tar -czf "$OUT/criu-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
exit $fail
