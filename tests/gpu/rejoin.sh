#!/usr/bin/env bash
# A helper restart under running jobs, on the GPU machine:
#
#   bash tests/gpu/rejoin.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB]
#
# work.py holding GB (default 8) of GPU memory and a training script with
# DataLoader workers (matrix_workloads.py train_dataloader, PyTorch's
# expandable segments: cuMemCreate/cuMemMap memory) run under `gpucr run`.
# The helper is killed (SIGKILL) and started again 2 s later on the same
# socket. Both must rejoin it (`gpucr status`: rejoined, checkpointable),
# their GPU memory moved into the new helper's; the table says how much each
# moved and how long it waited at its gate. Then each is checkpointed (the
# process ends) and restored: the training script must print every line a
# plain run prints, work.py's checksum must advance. Images in /dev/shm.
# Logs in build/gpu/rejoin (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: rejoin.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB]"
prefix_criu_args "$usage" "$@"
A=${3:?$usage}
A=$(cd "$A" && pwd)
GB=${4:-8}
PY=${PYTHON:-python3}
fresh_logs build/gpu/rejoin
use_criu "$C" || exit 1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
IMG=/dev/shm/gpucr-rejoin
SOCK=/run/gpucr-rejoin/helper.sock
W=$PWD/tests/gpu/matrix_workloads.py
STEPS=${STEPS:-500}
rm -rf "$IMG" && mkdir -p "$IMG"
HELPER=
cleanup() {
	pkill -9 -f "$A/work.py" 2>/dev/null
	pkill -9 -f matrix_workloads.py 2>/dev/null
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null
	rm -rf "$IMG"
	[ -n "${OUT:-}" ] && tar -czf "$OUT/rejoin-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 143' TERM INT

note_host "work.py $GB GB; train_dataloader $STEPS steps"
start_helper "$GPUCR" "$SOCK" "$LOGS/helper-1.log" --log-level info || { bad "the helper does not start"; exit 1; }

# The jobs: work.py, and the training script (plain beside it for the reference).
WL=$LOGS/work.log
setsid "$GPUCR" run --socket "$SOCK" -- $PY "$A/work.py" "$GB" "$WL" </dev/null >"$LOGS/work.out" 2>&1 &
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $PY "$W" train_dataloader "$LOGS/train-plain.txt" "$STEPS" >"$LOGS/train-plain.out" 2>&1 &
PLAIN=$!
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True MATRIX_DELAY=0.04 setsid "$GPUCR" run --socket "$SOCK" -- \
	$PY "$W" train_dataloader "$LOGS/train.txt" "$STEPS" </dev/null >"$LOGS/train.out" 2>&1 &
for _ in $(seq 900); do
	grep -q '^ready' "$WL" 2>/dev/null && [ "$(grep -c '^step' "$LOGS/train.txt" 2>/dev/null)" -gt 30 ] 2>/dev/null && break
	sleep 0.1
done
WP=$(grep -o 'pid=[0-9]*' "$WL" 2>/dev/null | head -1 | cut -d= -f2)
TP=$(grep -o 'pid=[0-9]*' "$LOGS/train.txt" 2>/dev/null | head -1 | cut -d= -f2)
[ -n "$WP" ] && [ -n "$TP" ] || { bad "the jobs did not start: $(tail -n 3 "$LOGS/work.out" "$LOGS/train.out")"; exit 1; }
sleep 1
"$GPUCR" status --socket "$SOCK" >"$LOGS/status-1.txt" 2>&1

# The helper dies; the jobs run on; the next one starts.
kill -9 "$HELPER"
wait "$HELPER" 2>/dev/null
HELPER=
n0=$(hbs "$WL")
s0=$(grep -c '^step' "$LOGS/train.txt")
sleep 2
note "with no helper for 2 s: work.py $(($(hbs "$WL") - n0)) heartbeats, train_dataloader $(($(grep -c '^step' "$LOGS/train.txt") - s0)) steps"
t0=$(now)
start_helper "$GPUCR" "$SOCK" "$LOGS/helper-2.log" --log-level info || { bad "the second helper does not start"; exit 1; }
ok=
for _ in $(seq 300); do
	"$GPUCR" status --socket "$SOCK" --json >"$LOGS/status-2.json" 2>&1
	ok=$($PY - "$LOGS/status-2.json" "$WP" "$TP" <<'PYEOF'
import json, sys
st = json.load(open(sys.argv[1]))
want = {int(p) for p in sys.argv[2:]}
done = [c for c in st.get("clients", []) if c["pid"] in want and c.get("checkpointable") and c.get("rejoined")]
print("yes" if len(done) == len(want) else "")
PYEOF
)
	[ -n "$ok" ] && break
	sleep 0.1
done
t1=$(now)
"$GPUCR" status --socket "$SOCK" >"$LOGS/status-2.txt" 2>&1
[ -n "$ok" ] || bad "the jobs did not both rejoin the new helper: $(cat "$LOGS/status-2.txt")"
note "both rejoined and checkpointable $(span "$t0" "$t1") after the new helper's start"
note "| process | allocations moved | bytes moved | left behind | held at its gate |"
note "|---|---|---|---|---|"
$PY - "$LOGS/status-2.json" "$WP" "$TP" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, sys
st = json.load(open(sys.argv[1]))
names = {int(sys.argv[2]): "work.py", int(sys.argv[3]): "train_dataloader"}
for c in st.get("clients", []):
    r = c.get("rejoined")
    if c["pid"] in names and r:
        print(f"| {names[c['pid']]} | {r['allocations']} | {r['bytes'] / 2**30:.2f} GiB | {r['allocations_left']} | {r['seconds']:.3f} s |")
PYEOF

# Each checkpointed (it ends) and restored from the new helper.
adv=$(checksum_advancing "$WL")
[ "$adv" = yes ] || bad "work.py's checksum does not advance after the rejoin"
"$GPUCR" checkpoint "$WP" -D "$IMG/work" --socket "$SOCK" --json >"$LOGS/work-ckpt.json" 2>&1 || bad "work.py checkpoint: $(tail -n 3 "$LOGS/work-ckpt.json")"
n1=$(hbs "$WL")
"$GPUCR" restore -D "$IMG/work" --socket "$SOCK" --json >"$LOGS/work-restore.json" 2>&1 || bad "work.py restore: $(tail -n 3 "$LOGS/work-restore.json")"
t3=$(next_heartbeat "$WL" "$n1")
adv=no
[ -n "$t3" ] && adv=$(checksum_advancing "$WL")
note "work.py after the rejoin: checkpoint $(printf '%.3f' "$(jf "$LOGS/work-ckpt.json" seconds)") s, restore $(printf '%.3f' "$(jf "$LOGS/work-restore.json" seconds)") s, checksum advancing after: $adv"
[ "$adv" = yes ] || bad "work.py: no advancing heartbeat after its restore"
pkill -9 -f "$A/work.py"

AT=$(grep -c '^step' "$LOGS/train.txt")
"$GPUCR" checkpoint "$TP" -D "$IMG/train" --socket "$SOCK" >"$LOGS/train-ckpt.txt" 2>&1 || bad "train_dataloader checkpoint: $(tail -n 3 "$LOGS/train-ckpt.txt")"
"$GPUCR" restore -D "$IMG/train" --socket "$SOCK" >"$LOGS/train-restore.txt" 2>&1 || bad "train_dataloader restore: $(tail -n 3 "$LOGS/train-restore.txt")"
for _ in $(seq 1200); do
	grep -q '^done' "$LOGS/train.txt" 2>/dev/null && break
	pgrep -f "train_dataloader $LOGS/train.txt" >/dev/null || break
	sleep 0.1
done
wait $PLAIN
if grep -q '^done' "$LOGS/train.txt" && diff <(grep -v '^ready' "$LOGS/train-plain.txt") <(grep -v '^ready' "$LOGS/train.txt") >"$LOGS/train-diff.txt"; then
	note "train_dataloader, $STEPS steps, through the helper's restart, then checkpointed and restored at step ${AT}ish: every line equals the plain run's"
else
	bad "train_dataloader differs from the plain run or did not finish (train-diff.txt): $(tail -n 2 "$LOGS/train.txt"); $(tail -n 5 "$LOGS/train.out")"
fi
note "interposer lines: $(grep -h '^gpucr:' "$LOGS/work.out" "$LOGS/train.out" | cut -c1-200 | sort | uniq -c | sort -rn | head -5 | tr '\n' ';')"
exit $fail
