#!/usr/bin/env bash
# A leave-running checkpoint's stall as the application sees it, on the GPU
# machine: the anchor, the build before, and this build with and without
# concurrency, in one run.
#
#   bash tests/gpu/bench-concurrent.sh NEW_PREFIX BASE_PREFIX CRIU_BUNDLE ANCHOR_DIR [SIZE...]
#
# SIZE: GB of GPU memory held by tests/gpu/stall_job.py (default 8 32), GB:hotN
# (only N of its 256 MB buffers rewritten, the rest held still: weights
# beside a cache), or "train": its transformer training job (about 11 GB). For each size the job
# runs four times, once per line:
#   anchor      plain, checkpointed by NVIDIA's driver API and CRIU
#               (drvckpt lock checkpoint; criu dump --leave-running;
#               drvckpt restore unlock)
#   base        under BASE_PREFIX's gpucr (the build before; "-" skips it),
#               gpucr checkpoint --leave-running
#   stop-copy   under this build, --leave-running --concurrent=false
#   concurrent  under this build, --leave-running --concurrent
#   cow         under this build with gpucr helper --concurrent-mode
#               copy-on-write: --leave-running --concurrent with no snapshot
#               memory (every buffer saved behind a copy-on-write window)
# each NCK (default 2; the anchor ANCHOR_NCK) times, GAP seconds apart
# (default 4); LINES (default "base stop-copy concurrent") picks gpucr's. Then the last
# concurrent (and cow) image is restored after the job is killed, and every heartbeat
# of the restored process must equal the original's for the same step
# ("exact"). stall_table.py prints the table (the stall is the job's longest
# gap between two steps) and draws stall.png. Images in /dev/shm; logs in
# build/gpu/concurrent (and $OUT). DEADLINE (seconds, default 540) bounds the
# whole: no size starts after it.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: bench-concurrent.sh NEW_PREFIX BASE_PREFIX CRIU_BUNDLE ANCHOR_DIR [SIZE...]"
NEW=$(cd "${1:?$usage}" && pwd)
BASE=${2:?$usage}
[ "$BASE" = - ] || BASE=$(cd "$BASE" && pwd)
C=${3:?$usage}
A=$(cd "${4:?$usage}" && pwd)
shift 4
SIZES=${*:-8 32}
NCK=${NCK:-2}
GAP=${GAP:-4}
DEADLINE=$(($(date +%s) + ${DEADLINE:-540}))
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/concurrent
EV=$LOGS/events.tsv
: >"$EV"
use_criu "$C" || exit 1
gcc -O2 -I/usr/local/cuda/include -o "$LOGS/drvckpt" "$A/drvckpt.c" -L/usr/local/cuda/lib64/stubs -lcuda || exit 1
IMG=/dev/shm/gpucr-conc
SOCK=/run/gpucr-conc/helper.sock
JOBPID=
cleanup() {
	[ -n "$JOBPID" ] && kill -9 "$JOBPID" 2>/dev/null
	pkill -9 -f "$JOB" 2>/dev/null
	[ -n "${HELPER:-}" ] && kill "$HELPER" 2>/dev/null
	rm -rf "$IMG"
}
trap cleanup EXIT
note_host

# start_job GPUCR|"" SIZE LOG: the job, under `GPUCR run` unless GPUCR is
# empty; its pid in P (empty if it did not start within 3 minutes).
start_job() {
	local g=$1 size=$2 log=$3 args
	rm -f "$log"
	case $size in
	train) args=(0 "$log" --train) ;;
	*:hot*) args=("${size%%:*}" "$log" "--hot=${size##*:hot}") ;; # GB:hotN: only N buffers rewritten
	*) args=("$size" "$log") ;;
	esac
	if [ -n "$g" ]; then
		setsid "$g" run --socket "$SOCK" -- $PY "$JOB" "${args[@]}" </dev/null >"$log.out" 2>&1 &
	else
		setsid $PY "$JOB" "${args[@]}" </dev/null >"$log.out" 2>&1 &
	fi
	JOBPID=$!
	P=
	for _ in $(seq 1800); do grep -q '^ready' "$log" 2>/dev/null && break; sleep 0.1; done
	P=$(grep -o 'pid=[0-9]*' "$log" 2>/dev/null | head -1 | cut -d= -f2)
	[ -n "$P" ] || { bad "$size: the job did not start: $(tail -n 3 "$log.out")"; return 1; }
	sleep 3 # steady steps before the first checkpoint
}
stop_job() {
	kill -9 "$P" 2>/dev/null
	pkill -9 -f "$JOB" 2>/dev/null
	wait "$JOBPID" 2>/dev/null
	JOBPID=
	sleep 1
}
# mark SIZE LINE T0 REPORT STEPLOG [failed]: one line of the table.
mark() { echo "$1 $2 $3 $(now) $4 $5 ${6:-}" >>"$EV"; }

for size in $SIZES; do
	[ "$(date +%s)" -lt "$DEADLINE" ] || { note "$size: not run (DEADLINE)"; continue; }
	note ""
	note "## $size"
	# anchor
	L=$LOGS/anchor-$size.log
	if [ "${ANCHOR_NCK:-$NCK}" -gt 0 ] && start_job "" "$size" "$L"; then
		for n in $(seq "${ANCHOR_NCK:-$NCK}"); do
			D=$IMG/anchor && rm -rf "$D" && mkdir -p "$D"
			t0=$(now)
			"$LOGS/drvckpt" lock checkpoint "$P" >"$LOGS/anchor-$size-$n.txt" 2>&1 &&
				"$GPUCR_CRIU" dump -t "$P" -D "$D" --leave-running --manage-cgroups=ignore >>"$LOGS/anchor-$size-$n.txt" 2>&1
			rc=$?
			"$LOGS/drvckpt" restore unlock "$P" >>"$LOGS/anchor-$size-$n.txt" 2>&1 || rc=1
			mark "$size" anchor "$t0" - "$L" "$([ $rc = 0 ] || echo failed)"
			[ $rc = 0 ] || bad "anchor $size #$n: $(tail -n 3 "$LOGS/anchor-$size-$n.txt")"
			rm -rf "$D"
			sleep "$GAP"
		done
		stop_job
	fi
	# gpucr: the build before, then this one
	for line in ${LINES:-base stop-copy concurrent}; do
		g=$NEW/bin/gpucr flags=() hflags=()
		case $line in
		base)
			[ "$BASE" = - ] && continue
			g=$BASE/bin/gpucr
			;;
		stop-copy) flags=(--concurrent=false) ;;
		concurrent) flags=(--concurrent) ;;
		cow) flags=(--concurrent) hflags=(--concurrent-mode copy-on-write) ;;
		esac
		[ "$line" = concurrent ] && [ -n "${HELPER:-}" ] && [ "$g" = "$NEW/bin/gpucr" ] && [ -n "$P" ] && kill -0 "$P" 2>/dev/null && reuse=1 || reuse=
		if [ -z "$reuse" ]; then
			[ -n "${HELPER:-}" ] && { kill "$HELPER"; wait "$HELPER" 2>/dev/null; HELPER=; }
			# HELPER_FLAGS: more flags for this build's helper (not the build before's)
			# shellcheck disable=SC2206
			[ "$g" = "$NEW/bin/gpucr" ] && hflags+=(${HELPER_FLAGS:-})
			start_helper "$g" "$SOCK" "$LOGS/helper-$line.log" "${hflags[@]}" || { bad "$line: helper"; continue; }
			L=$LOGS/$line-$size.log
			start_job "$g" "$size" "$L" || continue
		fi
		for n in $(seq "$NCK"); do
			D=$IMG/$line-$n && rm -rf "$D"
			t0=$(now)
			rc=0
			"$g" checkpoint "$P" -D "$D" --leave-running "${flags[@]}" --socket "$SOCK" --json >"$LOGS/$line-$size-$n.json" 2>&1 || rc=1
			mark "$size" "$line" "$t0" "$LOGS/$line-$size-$n.json" "$L" "$([ $rc = 0 ] || echo failed)"
			[ $rc = 0 ] || bad "$line $size #$n: $(tail -n 3 "$LOGS/$line-$size-$n.json")"
			case $line in concurrent | cow) [ "$n" = "$NCK" ] || rm -rf "$D" ;; *) rm -rf "$D" ;; esac
			sleep "$GAP"
		done
		[ "$line" = stop-copy ] && continue # the concurrent line runs on in the same job
		if [ "$line" = concurrent ] || [ "$line" = cow ]; then
			# exactness: the last image, restored after the job is killed
			before=$(grep -c '^hb' "$L")
			stop_job
			sleep 2
			t0=$(now)
			if "$g" restore -D "$IMG/$line-$NCK" --socket "$SOCK" --json >"$LOGS/restore-$line-$size.json" 2>&1; then
				for _ in $(seq 600); do [ "$(grep -c '^hb' "$L")" -gt $((before + 5)) ] && break; sleep 0.05; done
				note "$line $size: restore of the last image: $(span "$t0" "$(now)") to its 6th heartbeat"
				pkill -9 -f "$JOB" 2>/dev/null
				$PY - "$L" "$before" "$line $size" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
hb = [l.split() for l in open(sys.argv[1]) if l.startswith("hb ")]
n = int(sys.argv[2])
orig = {int(h[1]): h[3] for h in hb[:n]}
after = hb[n:]
same = [h for h in after if int(h[1]) in orig and orig[int(h[1])] == h[3]]
diff = [h for h in after if int(h[1]) in orig and orig[int(h[1])] != h[3]]
print(f"{sys.argv[3]}: exact: {'yes' if after and not diff and same else 'NO'} (restored at step {after[0][1] if after else '-'}; "
      f"{len(same)} heartbeats equal to the original's, {len(diff)} differ)")
PYEOF
			else
				bad "restore $line $size: $(tail -n 3 "$LOGS/restore-$line-$size.json")"
			fi
			rm -rf "$IMG"
		else
			stop_job
		fi
	done
	[ -n "${HELPER:-}" ] && { kill "$HELPER"; wait "$HELPER" 2>/dev/null; HELPER=; }
done
grep -q "exact: NO" "$LOGS/summary.txt" && fail=1
$PY tests/gpu/stall_table.py "$EV" "$LOGS/stall.png" | tee -a "$LOGS/summary.txt"
if [ -n "${OUT:-}" ]; then
	cp "$LOGS/summary.txt" "$LOGS/stall.png" "$OUT/" 2>/dev/null
	tar czf "$OUT/concurrent-logs.tgz" -C "$(dirname "$LOGS")" --exclude drvckpt "$(basename "$LOGS")"
fi
exit $fail
