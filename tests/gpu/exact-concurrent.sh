#!/usr/bin/env bash
# Exactness of concurrent checkpoints with a real training job, on the GPU
# machine:
#
#   bash tests/gpu/exact-concurrent.sh GPUCR_PREFIX CRIU_BUNDLE [N]
#
# tests/gpu/stall_job.py --train-small (a transformer LM, AdamW, a
# DataLoader with 2 workers, deterministic) runs under gpucr; it is
# checkpointed with `gpucr checkpoint --leave-running --concurrent` N times
# (default 20) at random moments (0.3 to 2.5 s apart) while it trains on.
# Then it is killed and each image restored in turn: every restored run must
# report, for each step, the running loss sum the original run reported for
# that step. HELPER_FLAGS go to the helper (--concurrent-mode copy-on-write:
# every buffer behind a copy-on-write window). Images in /dev/shm; logs in
# build/gpu/exact (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: exact-concurrent.sh GPUCR_PREFIX CRIU_BUNDLE [N]" "$@"
N=${3:-20}
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/exact
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-exact
SOCK=/run/gpucr-exact/helper.sock
trap 'pkill -9 -f "$JOB" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
rm -rf "$IMG" && mkdir -p "$IMG"
# HELPER_FLAGS: say --concurrent-mode copy-on-write, to check the windows.
# shellcheck disable=SC2086
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" ${HELPER_FLAGS:-} || { bad "helper"; exit 1; }
L=$LOGS/train.log
setsid "$GPUCR" run --socket "$SOCK" -- $PY "$JOB" 0 "$L" --train-small </dev/null >"$LOGS/train.out" 2>&1 &
for _ in $(seq 1200); do grep -q '^hb 10 ' "$L" 2>/dev/null && break; sleep 0.1; done
P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
[ -n "$P" ] || { bad "the job did not start: $(tail -n 5 "$LOGS/train.out")"; exit 1; }
note_host "job pid $P"
for k in $(seq "$N"); do
	sleep "$($PY -c "import random; print(round(random.uniform(0.3, 2.5), 2))")"
	at=$(grep '^st' "$L" | tail -1 | awk '{print $2}')
	"$GPUCR" checkpoint "$P" -D "$IMG/$k" --leave-running --concurrent --socket "$SOCK" --json >"$LOGS/ckpt-$k.json" 2>&1 ||
		bad "checkpoint $k: $(tail -n 3 "$LOGS/ckpt-$k.json")"
	echo "$k $at" >>"$LOGS/points.txt"
done
sleep 3
TREE=$(pgrep -f "$JOB" | tr '\n' ' ') # the job and its DataLoader workers: a restore needs their pids
# stop_all kills the job's tree and waits (up to 20 s) until its pids are
# free: zombies reaped, whoever their parent is now.
stop_all() {
	pkill -9 -f "$JOB"
	for _ in $(seq 400); do
		local left=
		for p in $TREE; do [ -e "/proc/$p" ] && left=1; done
		[ -z "$left" ] && return
		sleep 0.05
	done
	note "pids of the tree still held: $(for p in $TREE; do [ -e /proc/$p ] && echo "$p($(cat /proc/$p/stat 2>/dev/null | cut -d' ' -f3))"; done)"
}
stop_all
orig=$(grep -c '^hb' "$L")
for k in $(seq "$N"); do
	[ -d "$IMG/$k" ] || continue
	mark=$(grep -c '^hb' "$L")
	if ! "$GPUCR" restore -D "$IMG/$k" --socket "$SOCK" --json >"$LOGS/restore-$k.json" 2>&1; then
		bad "restore $k: $(tail -n 3 "$LOGS/restore-$k.json")"
		stop_all
		continue
	fi
	for _ in $(seq 600); do [ "$(grep -c '^hb' "$L")" -ge $((mark + 3)) ] && break; sleep 0.05; done
	stop_all
	$PY - "$L" "$orig" "$mark" "$k" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
hb = [l.split() for l in open(sys.argv[1]) if l.startswith("hb ")]
orig, mark, k = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ref = {}
for h in hb[:orig]:
    ref.setdefault(int(h[1]), h[3])
after = hb[mark:]
same = sum(1 for h in after if ref.get(int(h[1])) == h[3])
diff = [h[1] for h in after if int(h[1]) in ref and ref[int(h[1])] != h[3]]
ok = after and not diff and same == len(after)
print(f"image {k}: {'exact' if ok else 'NOT EXACT'}: restored at step {after[0][1] if after else '-'}, "
      f"{same} of {len(after)} heartbeats equal to the original run's" + (f"; differ at {diff}" if diff else ""))
PYEOF
	rm -rf "${IMG:?}/$k"
done
n=$(grep -c ': exact:' "$LOGS/summary.txt")
note "$n of $N images restored exactly"
# How often a window's speculation failed (a write it did not see): each
# such checkpoint was taken again, stop-the-world.
note "$(grep -l '"redone"' "$LOGS"/ckpt-*.json 2>/dev/null | wc -l) of $N checkpoints taken again (a window found memory changed behind its back)"
[ "$n" = "$N" ] || fail=1
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/exact.txt" && cp "$LOGS"/ckpt-1.json "$OUT/" 2>/dev/null
exit $fail
