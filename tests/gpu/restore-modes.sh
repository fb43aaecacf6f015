#!/usr/bin/env bash
# Restore, the ways gpucr offers it, side by side with the anchor and an
# earlier build, on one GPU:
#
#   bash tests/gpu/restore-modes.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [BASE_PREFIX]
#
# PARTS (default "anchor work torch") picks the sections:
#   anchor  the anchor's own script (CRIU + the driver checkpoint API) at SIZES.
#   work    for each size in SIZES (default "8 32", GB): the anchor's work.py
#           under `gpucr run`, dumped once (`gpucr checkpoint`), then restored
#           from that image once per mode: plain (the whole GPU image loaded
#           before the process runs), ondemand (`gpucr restore --on-demand`:
#           it runs while the image loads), resident (`gpucr image load` first:
#           the load copies on the GPU); with BASE_PREFIX, the base build's
#           plain restore of its own dump too. Each: the seconds from the
#           restore command's start to the next heartbeat, the restore's own
#           report (ready: first instruction, GPU launches, all data resident),
#           and whether the heartbeats after it equal the plain restore's
#           (work.py's checksum depends only on its iteration). WORK_MODES
#           (default "plain ondemand resident lazy"; also "ondemand-lazy")
#           picks the new build's modes; lazy is `--lazy-pages` (CRIU's
#           lazy-pages daemon serves host memory as it is touched).
#   torch   tests/gpu/stall_job.py --train-small (a transformer with AdamW and
#           DataLoader workers) dumped once and restored plain and on demand:
#           the time to its next step, and whether its losses after the
#           restore equal an uninterrupted run's.
# Images in /dev/shm; logs in build/gpu/restore-modes (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: restore-modes.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [BASE_PREFIX]"
prefix_criu_args "$usage" "$@"
A=${3:?$usage}
A=$(cd "$A" && pwd)
BASE=${4:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
SIZES=${SIZES:-8 32}
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/restore-modes
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-restore-modes
SOCK=/run/gpucr-restore-modes/helper.sock
trap 'pkill -9 -f "$A/work.py" 2>/dev/null; pkill -9 -f "$JOB" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
PARTS=${PARTS:-anchor work torch}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
note_host

if part anchor; then
	bash "$A/run-anchor.sh" "$GPUCR_CRIU" $SIZES >"$LOGS/anchor.txt" 2>&1 || bad "the anchor's script failed"
	sed 's/^/    anchor: /' "$LOGS/anchor.txt" | tail -n 8 | tee -a "$LOGS/summary.txt"
fi

# ready FILE: the "ready" numbers of a restore's --json report, one line.
ready() {
	$PY -c '
import json, sys
t = open(sys.argv[1]).read()
r = json.loads(t[t.rindex("\n{") + 1:] if "\n{" in t else t)
rd, g = r.get("ready") or {}, r.get("gpu") or {}
fi, gl, gr = (rd.get(k, 0) for k in ("first_instruction_seconds", "gpu_launch_seconds", "gpu_resident_seconds"))
res = " from the resident copy" if g.get("from_resident") else ""
secs = g.get("seconds", 0)
print(f"first instruction {fi:.3f}, GPU launches {gl:.3f}, all GPU data {gr:.3f} s; load {secs:.3f} s{res}")' "$1" 2>/dev/null
}

# work_build NAME GPUCR MODES...: for each size, one dump, one restore per mode.
work_build() {
	local name=$1 g=$2
	shift 2
	rm -rf "$IMG" && mkdir -p "$IMG"
	start_helper "$g" "$SOCK" "$LOGS/$name-helper.log" --resident-memory 40G 2>/dev/null ||
		start_helper "$g" "$SOCK" "$LOGS/$name-helper.log" || { bad "$name: helper"; return; }
	for gb in $SIZES; do
		local L=$LOGS/$name-work-$gb.log P
		rm -f "$L"
		setsid "$g" run --socket "$SOCK" -- $PY "$A/work.py" "$gb" "$L" </dev/null >"$LOGS/$name-work-$gb.out" 2>&1 &
		for _ in $(seq 1200); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
		P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
		[ -n "$P" ] || { bad "$name $gb GB: work.py did not start: $(tail -n 3 "$LOGS/$name-work-$gb.out")"; continue; }
		sleep 1
		if ! "$g" checkpoint "$P" -D "$IMG/w$gb" --socket "$SOCK" --json >"$LOGS/$name-dump-$gb.json" 2>&1; then
			bad "$name $gb GB: dump: $(tail -n 3 "$LOGS/$name-dump-$gb.json")"
			pkill -9 -f "$A/work.py"
			continue
		fi
		pid_gone "$P"
		cp "$L" "$L.at-dump"
		for mode in "$@"; do
			local flags=() tag=$name-$mode-$gb mark t0 t1
			cp "$L.at-dump" "$L" # CRIU restores an open file only as it was at the dump
			mark=$(hbs "$L")
			case $mode in
			ondemand) flags=(--on-demand) ;;
			lazy) flags=(--lazy-pages) ;;
			ondemand-lazy) flags=(--on-demand --lazy-pages) ;;
			resident) "$g" image load "$IMG/w$gb" --socket "$SOCK" >"$LOGS/$tag-load.txt" 2>&1 || bad "$tag: image load: $(tail -n 2 "$LOGS/$tag-load.txt")" ;;
			esac
			t0=$(now)
			if "$g" restore -D "$IMG/w$gb" --socket "$SOCK" --json "${flags[@]}" >"$LOGS/$tag.json" 2>&1; then
				t1=$(next_heartbeat "$L" "$mark")
				for _ in $(seq 200); do [ "$(hbs "$L")" -ge $((mark + 8)) ] && break; sleep 0.05; done
				cp "$L" "$LOGS/$tag.log"
				note "$name $gb GB $mode: restore to the next heartbeat $([ -n "$t1" ] && span "$t0" "$t1" || echo never); $(ready "$LOGS/$tag.json")"
			else
				bad "$tag: restore: $(tail -n 3 "$LOGS/$tag.json")"
			fi
			[ "$mode" = resident ] && "$g" image unload "$IMG/w$gb" --socket "$SOCK" >/dev/null 2>&1
			pkill -9 -f "$A/work.py"
			pid_gone "$P"
		done
		# Every restore of one image computes the same: heartbeats by iteration.
		$PY - "$name $gb GB" "$LOGS/$name-plain-$gb.log" "$@" <<PYEOF | tee -a "$LOGS/summary.txt"
import sys
def beats(p):
    try:
        return {l.split()[1]: l.split()[3] for l in open(p) if l.startswith("hb ")}
    except OSError:
        return {}
ref = beats(sys.argv[2])
for mode in sys.argv[3:]:
    if mode == "plain":
        continue
    got = beats("$LOGS/$name-" + mode + "-$gb.log")
    both = [i for i in got if i in ref]
    same = sum(1 for i in both if got[i] == ref[i])
    print(f"{sys.argv[1]} {mode}: {'SAME' if both and same == len(both) else 'DIFFERENT'} checksums as the plain restore's "
          f"({same} of {len(both)} heartbeats both reached)")
PYEOF
		rm -rf "$IMG/w$gb"
	done
	kill $HELPER 2>/dev/null
	wait $HELPER 2>/dev/null
}

if part work; then
	work_build new "$G/bin/gpucr" ${WORK_MODES:-plain ondemand resident lazy}
	[ -n "$BASE" ] && work_build base "$BASE/bin/gpucr" plain
	grep -q "DIFFERENT checksums" "$LOGS/summary.txt" && fail=1
fi

if part torch; then
	REF=$LOGS/torch-ref.log
	setsid $PY "$JOB" 0 "$REF" --train-small </dev/null >"$LOGS/torch-ref.out" 2>&1 &
	RP=$!
	for _ in $(seq 1800); do grep -q '^hb 150 ' "$REF" 2>/dev/null && break; sleep 0.1; done
	kill -9 $RP 2>/dev/null
	pkill -9 -f "$REF"
	jobs_gone() { for _ in $(seq 400); do pgrep -f "$JOB" >/dev/null || return 0; sleep 0.05; done; return 1; }
	rm -rf "$IMG" && mkdir -p "$IMG"
	start_helper "$G/bin/gpucr" "$SOCK" "$LOGS/torch-helper.log" || bad "torch helper"
	L=$LOGS/torch.log
	setsid "$G/bin/gpucr" run --socket "$SOCK" -- $PY "$JOB" 0 "$L" --train-small </dev/null >"$LOGS/torch.out" 2>&1 &
	for _ in $(seq 1800); do grep -q '^hb 40 ' "$L" 2>/dev/null && break; sleep 0.1; done
	P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
	if [ -z "$P" ] || ! "$G/bin/gpucr" checkpoint "$P" -D "$IMG/t" --socket "$SOCK" --json >"$LOGS/torch-dump.json" 2>&1; then
		bad "torch dump: $(tail -n 3 "$LOGS/torch-dump.json" "$LOGS/torch.out" 2>/dev/null)"
	else
		pid_gone "$P"
		jobs_gone
		cp "$L" "$L.at-dump"
		for mode in plain ondemand; do
			flags=()
			[ "$mode" = ondemand ] && flags=(--on-demand)
			kids=$(pgrep -f "$JOB" | tr '\n' ' ')
			pkill -9 -f "$JOB"
			jobs_gone
			# CRIU needs every pid of the tree back, its DataLoader workers'
			# too, and the job's pid also as the session id that its workers'
			# zombies hold until the init process reaps them: all gone
			# first, outside the timing.
			for k in $kids; do pid_gone "$k"; done
			for _ in $(seq 400); do
				[ -z "$(ps -eo sid=,pid= | awk -v s="$P" '$1 == s')" ] && break
				sleep 0.05
			done
			cp "$L.at-dump" "$L"
			mark=$(hbs "$L")
			n=$(grep -c '^st' "$L")
			t0=$(now)
			if "$G/bin/gpucr" restore -D "$IMG/t" --socket "$SOCK" --json "${flags[@]}" >"$LOGS/torch-$mode.json" 2>&1; then
				for _ in $(seq 2000); do [ "$(grep -c '^st' "$L")" -gt "$n" ] && break; sleep 0.005; done
				t1=$(now)
				for _ in $(seq 600); do [ "$(hbs "$L")" -ge $((mark + 6)) ] && break; sleep 0.05; done
				pkill -9 -f "$JOB"
				$PY - "$L" "$REF" "$mark" "$mode" "$(span "$t0" "$t1")" "$(ready "$LOGS/torch-$mode.json")" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
hb = [l.split() for l in open(sys.argv[1]) if l.startswith("hb ")]
ref = {l.split()[1]: l.split()[3] for l in open(sys.argv[2]) if l.startswith("hb ")}
mark, mode, took, ready = int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
both = [h for h in hb[mark:] if h[1] in ref]
same = sum(1 for h in both if ref[h[1]] == h[3])
ok = len(both) >= 2 and same == len(both)
print(f"torch {mode}: restore to the next step {took}; losses {'EQUAL' if ok else 'DIFFER'}: {same} of {len(both)} "
      f"heartbeats after the restore equal to an uninterrupted run's; {ready}")
PYEOF
				grep -q "^torch $mode: .*losses EQUAL" "$LOGS/summary.txt" || fail=1
				cp "$L" "$LOGS/torch-$mode.log"
			else
				bad "torch $mode restore: $(tail -n 3 "$LOGS/torch-$mode.json")"
			fi
		done
	fi
	kill $HELPER 2>/dev/null
fi
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/restore-modes.txt"
exit $fail
