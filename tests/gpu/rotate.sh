#!/usr/bin/env bash
# A rotated series of checkpoints (keep the last few, delete the older), on
# the GPU machine:
#
#   bash tests/gpu/rotate.sh GPUCR_PREFIX CRIU_BUNDLE [GB]
#
# 1. stall_job.py holding GB (default 8) of GPU memory, one 256 MB buffer of
#    it changing (--hot=1), under `gpucr run`: five checkpoints
#    --leave-running --auto-parent into S/1..S/5. For each: the whole time,
#    the stall, the GPU bytes copied, its parent, and the series on disk (du
#    counts a chunk hard-linked into several images once). S/1 and S/2 are
#    deleted with rm -rf, S/3 with `gpucr image rm`; the job is killed and S/5
#    restored: every heartbeat the restored run shares with the original
#    must equal it.
# 2. A training script with DataLoader workers (matrix_workloads.py
#    train_dataloader, expandable segments) under `gpucr run`: two
#    --leave-running --auto-parent checkpoints T/1, T/2, then T/3 (the job
#    ends), T/1 removed with rm -rf and T/2 with `gpucr image rm`; T/3
#    restored must print every line a plain run prints.
# Images in /dev/shm. Logs in build/gpu/rotate (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: rotate.sh GPUCR_PREFIX CRIU_BUNDLE [GB]" "$@"
GB=${3:-8}
PY=${PYTHON:-python3}
JOB=$PWD/tests/gpu/stall_job.py
W=$PWD/tests/gpu/matrix_workloads.py
STEPS=${STEPS:-500}
fresh_logs build/gpu/rotate
use_criu "$C" || exit 1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
IMG=/dev/shm/gpucr-rotate
S=$IMG/stall
T=$IMG/train
SOCK=/run/gpucr-rotate/helper.sock
HELPER=
cleanup() {
	pkill -9 -f "$JOB" 2>/dev/null
	pkill -9 -f matrix_workloads.py 2>/dev/null
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null
	rm -rf "$IMG"
	[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/rotate.txt" &&
		tar -czf "$OUT/rotate-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 143' TERM INT
rm -rf "$IMG" && mkdir -p "$S" "$T"

note_host "stall_job $GB GB; train_dataloader $STEPS steps"
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info || { bad "the helper does not start"; exit 1; }

# 1. A series of five, the oldest three deleted, the newest restored.
L=$LOGS/stall.log
setsid "$GPUCR" run --socket "$SOCK" -- $PY "$JOB" "$GB" "$L" --hot=1 </dev/null >"$LOGS/stall.out" 2>&1 &
for _ in $(seq 1800); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
P=$(grep -o 'pid=[0-9]*' "$L" | head -1 | cut -d= -f2)
[ -n "$P" ] || { bad "stall_job did not start: $(tail -n 3 "$LOGS/stall.out")"; exit 1; }
sleep 2
note "| checkpoint | whole | stall | GPU copied | parent | series on disk | sum of the images alone |"
note "|---|---|---|---|---|---|---|"
for n in 1 2 3 4 5; do
	"$GPUCR" checkpoint "$P" -D "$S/$n" --leave-running --auto-parent --socket "$SOCK" --json >"$LOGS/stall-$n.json" 2>&1 ||
		{ bad "checkpoint $n: $(tail -n 3 "$LOGS/stall-$n.json")"; exit 1; }
	alone=0
	for d in "$S"/*/; do alone=$((alone + $(du -sm "$d" | cut -f1))); done
	note "| $n | $(printf '%.3f' "$(jf "$LOGS/stall-$n.json" seconds)") s | $(printf '%.3f' "$(jf "$LOGS/stall-$n.json" stall_seconds)") s | $($PY -c "print(f'{$(jf "$LOGS/stall-$n.json" gpu bytes_moved || echo 0)/2**30:.2f} GiB')" 2>/dev/null) | $(basename "$(jf "$LOGS/stall-$n.json" parent)") | $(du -smc "$S"/*/ | tail -1 | cut -f1) MiB | $alone MiB |"
	[ "$n" -gt 1 ] && [ "$(jf "$LOGS/stall-$n.json" parent)" != "$S/$((n - 1))" ] && bad "checkpoint $n's parent is not $S/$((n - 1)): $(jf "$LOGS/stall-$n.json" parent)"
	sleep 1
done
rm -rf "$S/1" "$S/2"
"$GPUCR" image rm "$S/3" >"$LOGS/image-rm.txt" 2>&1 || bad "gpucr image rm $S/3: $(tail -n 3 "$LOGS/image-rm.txt")"
[ -e "$S/3" ] && bad "gpucr image rm left $S/3"
note "after rm -rf 1 2 and gpucr image rm 3: $(du -sm "$S" | cut -f1) MiB on disk; $("$GPUCR" image verify "$S/5" 2>&1 | tail -1 | cut -c1-160)"
# The original goes on past image 5, is killed, and 5 is restored (the
# sum is stall_job.py's fourth field).
restore_after_kill "$GPUCR" "$SOCK" "$S/5" "$L" "$P" "$JOB" "stall_job from image 5" 3

# 2. A training job: two kept, the third ends it; the first two deleted.
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $PY "$W" train_dataloader "$LOGS/train-plain.txt" "$STEPS" >"$LOGS/train-plain.out" 2>&1 &
PLAIN=$!
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True MATRIX_DELAY=0.04 setsid "$GPUCR" run --socket "$SOCK" -- \
	$PY "$W" train_dataloader "$LOGS/train.txt" "$STEPS" </dev/null >"$LOGS/train.out" 2>&1 &
for _ in $(seq 900); do [ "$(grep -c '^step' "$LOGS/train.txt" 2>/dev/null)" -gt 30 ] 2>/dev/null && break; sleep 0.1; done
TP=$(grep -o 'pid=[0-9]*' "$LOGS/train.txt" 2>/dev/null | head -1 | cut -d= -f2)
[ -n "$TP" ] || { bad "train_dataloader did not start: $(tail -n 3 "$LOGS/train.out")"; exit 1; }
for n in 1 2 3; do
	flags=(--leave-running)
	[ "$n" = 3 ] && flags=()
	"$GPUCR" checkpoint "$TP" -D "$T/$n" "${flags[@]}" --auto-parent --socket "$SOCK" --json >"$LOGS/train-$n.json" 2>&1 ||
		{ bad "train checkpoint $n: $(tail -n 3 "$LOGS/train-$n.json")"; break; }
	[ "$n" -gt 1 ] && [ "$(jf "$LOGS/train-$n.json" parent)" != "$T/$((n - 1))" ] && bad "train checkpoint $n's parent is not $T/$((n - 1))"
	sleep 1
done
AT=$(grep -c '^step' "$LOGS/train.txt")
rm -rf "$T/1"
"$GPUCR" image rm "$T/2" >>"$LOGS/image-rm.txt" 2>&1 || bad "gpucr image rm $T/2: $(tail -n 3 "$LOGS/image-rm.txt")"
pid_gone "$TP" || bad "pid $TP not free"
"$GPUCR" restore -D "$T/3" --socket "$SOCK" >"$LOGS/train-restore.txt" 2>&1 || bad "train restore of 3: $(tail -n 3 "$LOGS/train-restore.txt")"
for _ in $(seq 1200); do
	grep -q '^done' "$LOGS/train.txt" 2>/dev/null && break
	pgrep -f "train_dataloader $LOGS/train.txt" >/dev/null || break
	sleep 0.1
done
wait $PLAIN
if grep -q '^done' "$LOGS/train.txt" && diff <(grep -v '^ready' "$LOGS/train-plain.txt") <(grep -v '^ready' "$LOGS/train.txt") >"$LOGS/train-diff.txt"; then
	note "train_dataloader, $STEPS steps: checkpoints 1, 2 (running on) and 3 (ended, step ${AT}ish); 1 and 2 deleted; 3 restored: every line equals the plain run's"
else
	bad "train_dataloader differs from the plain run or did not finish (train-diff.txt): $(tail -n 2 "$LOGS/train.txt"); $(tail -n 5 "$LOGS/train.out")"
fi
exit $fail
