#!/usr/bin/env bash
# A restore, and a restore of a damaged GPU image, on the GPU machine:
#
#   bash tests/gpu/restore-damage.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX] [GB]
#
# tests/gpu/stall_job.py holding GB (default 8) runs under gpucr and is
# dumped (`gpucr checkpoint PID -D DIR`: it ends). Then, with each build:
#   - `gpucr restore -D DIR`: the time from the command's start to the job's
#     next step (the job ended at the dump: the other scripts check that a
#     restored run repeats the original's);
#   - one byte flipped in a chunk file of DIR/gpucr: the restore must fail
#     naming the damage, and no process of the job may be left. With the
#     new build the damage stops the restore at CRIU's POST_FORKING, before
#     the restored task runs.
# BASE_PREFIX: an earlier build, run the same way in the same call. Images in
# /dev/shm; logs in build/gpu/restore-damage (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: restore-damage.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX] [GB]" "$@"
BASE=${3:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
GB=${4:-8}
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/restore-damage
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-restore-damage
SOCK=/run/gpucr-restore-damage/helper.sock
trap 'pkill -9 -f "$JOB" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
note_host "stall_job.py $GB GB"

run() {
	local name=$1 g=$2/bin/gpucr
	rm -rf "$IMG" && mkdir -p "$IMG"
	start_helper "$g" "$SOCK" "$LOGS/$name-helper.log" || { bad "$name: helper"; return; }
	local L=$LOGS/$name-job.log
	setsid "$g" run --socket "$SOCK" -- $PY "$JOB" "$GB" "$L" </dev/null >"$LOGS/$name-job.out" 2>&1 &
	for _ in $(seq 1800); do grep -q '^hb 40 ' "$L" 2>/dev/null && break; sleep 0.1; done
	local P
	P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
	[ -n "$P" ] || { bad "$name: the job did not start: $(tail -n 3 "$LOGS/$name-job.out")"; kill $HELPER; return; }
	"$g" checkpoint "$P" -D "$IMG/d" --socket "$SOCK" --json >"$LOGS/$name-dump.json" 2>&1 || { bad "$name dump: $(tail -n 3 "$LOGS/$name-dump.json")"; kill $HELPER; return; }
	pid_gone "$P"
	local mark n t0 t1
	mark=$(grep -c '^hb' "$L")
	n=$(grep -c '^st' "$L")
	t0=$(now)
	if "$g" restore -D "$IMG/d" --socket "$SOCK" --json >"$LOGS/$name-restore.json" 2>&1; then
		for _ in $(seq 2000); do [ "$(grep -c '^st' "$L")" -gt "$n" ] && break; sleep 0.005; done
		t1=$(now)
		for _ in $(seq 600); do [ "$(grep -c '^hb' "$L")" -ge $((mark + 2)) ] && break; sleep 0.05; done
		note "$name: restore to the job's next step $(span "$t0" "$t1"); it ran on ($(($(hbs "$L") - mark)) heartbeats after the restore)"
	else
		bad "$name restore: $(tail -n 3 "$LOGS/$name-restore.json")"
	fi
	pkill -9 -f "$JOB"
	pid_gone "$P"
	# One byte of one chunk file flipped.
	local f
	f=$(find "$IMG/d/gpucr/chunks" -type f | head -1)
	$PY -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0x10; open(p,'wb').write(b)" "$f"
	if "$g" restore -D "$IMG/d" --socket "$SOCK" >"$LOGS/$name-damaged.txt" 2>&1; then
		bad "$name: the restore of a damaged image succeeded"
	fi
	sleep 1
	local left=no where=RESUME_DEVICES_LATE
	[ -e "/proc/$P" ] && left="yes ($(cut -d' ' -f3 "/proc/$P/stat" 2>/dev/null))"
	grep -q "before the restored processes run" "$LOGS/$name-damaged.txt" "$IMG/d/restore.log" 2>/dev/null && where=POST_FORKING
	note "$name: damaged chunk: restore failed ($(grep -o 'corrupt[^;]*' "$LOGS/$name-damaged.txt" | head -1)); stopped at $where; process left: $left"
	[ "$left" = no ] || fail=1
	grep -q corrupt "$LOGS/$name-damaged.txt" || bad "$name: the failure does not name the damage: $(tail -n 3 "$LOGS/$name-damaged.txt")"
	cp "$IMG/d/restore.log" "$LOGS/$name-damaged-restore.log" 2>/dev/null
	kill $HELPER 2>/dev/null
	wait $HELPER 2>/dev/null
}

run new "$G"
[ -n "$BASE" ] && run base "$BASE"
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/restore-damage.txt"
exit $fail
