#!/usr/bin/env bash
# Where a whole-process checkpoint's stall goes, on the GPU machine:
#
#   bash tests/gpu/stall-steps.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB...]
#
# For each size (default 8): work.py under gpucr run, two `gpucr checkpoint
# --leave-running --json` (the second one incremental, --parent the first)
# and one that ends it, then `gpucr restore --json`; the table prints each
# one's steps (CRIU's, and the helper's of the GPU process) from the
# reports' "phases". Images in /dev/shm; logs in build/gpu/steps (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: stall-steps.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB...]"
prefix_criu_args "$usage" "$@"
A=${3:?$usage}
A=$(cd "$A" && pwd)
shift 3
SIZES=${*:-8}
PY=${PYTHON:-python3}
# Not fresh_logs: build/gpu/steps is bench-steps.sh's too, and what that
# left there stays.
LOGS=${LOGS:-build/gpu/steps}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
: >"$LOGS/summary.txt"
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-steps
SOCK=/run/gpucr-steps/helper.sock
trap 'pkill -9 -f "$A/work.py" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
note_host
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" || { bad "helper"; exit 1; }
# steps FILE: "name s, ..." of a report's phases, then the GPU process's.
steps() { $PY -c "
import json,sys
r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
f=lambda ps: ', '.join('%s %.3f' % (p['name'], p['seconds']) for p in ps or [])
g=(r.get('gpu_processes') or [{}])[0].get('phases')
print('total %.3f s | %s%s' % (r.get('seconds', 0), f(r.get('phases')), (' || helper: ' + f(g)) if g else ''))" "$1"; }
for gb in $SIZES; do
	rm -rf "$IMG" && mkdir -p "$IMG"
	L=$LOGS/work-$gb.log
	rm -f "$L"
	setsid "$GPUCR" run --socket "$SOCK" -- $PY "$A/work.py" "$gb" "$L" </dev/null >"$LOGS/work-$gb.out" 2>&1 &
	for _ in $(seq 900); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
	P=$(grep -o 'pid=[0-9]*' "$L" | head -1 | cut -d= -f2)
	[ -n "$P" ] || { bad "$gb GB: work.py did not start"; continue; }
	sleep 1
	note ""
	note "## work.py, $gb GB"
	"$GPUCR" checkpoint "$P" -D "$IMG/1" --leave-running --socket "$SOCK" --json >"$LOGS/lr1-$gb.json" 2>&1 || bad "leave-running 1: $(tail -n 2 "$LOGS/lr1-$gb.json")"
	note "leave-running, full:        $(steps "$LOGS/lr1-$gb.json")"
	sleep 1
	"$GPUCR" checkpoint "$P" -D "$IMG/2" --leave-running --parent "$IMG/1" --socket "$SOCK" --json >"$LOGS/lr2-$gb.json" 2>&1 || bad "leave-running 2: $(tail -n 2 "$LOGS/lr2-$gb.json")"
	note "leave-running, incremental: $(steps "$LOGS/lr2-$gb.json")"
	sleep 1
	"$GPUCR" checkpoint "$P" -D "$IMG/3" --socket "$SOCK" --json >"$LOGS/dump-$gb.json" 2>&1 || bad "dump: $(tail -n 2 "$LOGS/dump-$gb.json")"
	note "dump (the process ends):    $(steps "$LOGS/dump-$gb.json")"
	"$GPUCR" restore -D "$IMG/3" --socket "$SOCK" --json >"$LOGS/restore-$gb.json" 2>&1 || bad "restore: $(tail -n 2 "$LOGS/restore-$gb.json")"
	note "restore:                    $(steps "$LOGS/restore-$gb.json")"
	pkill -9 -f "$A/work.py"
	sleep 1
done
[ -n "${OUT:-}" ] && cp -r "$LOGS" "$OUT/" 2>/dev/null
exit $fail
