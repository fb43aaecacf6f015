#!/usr/bin/env bash
# A 2-rank DDP job (tests/gpu/ddp.py: torchrun, NCCL, DataLoader workers) run
# plain and under `gpucr run`: both must print the same losses and gradient
# norms, step for step. Needs 2 GPUs (nvidia-h100-x2 or nvidia-h200-x2); on
# one it says SKIP and exits 0.
#
#   bash tests/gpu/ddp.sh GPUCR_PREFIX
#
# GPUCR_PREFIX: scripts/make-gpucr-bundle.sh output. STEPS (default 120) the
# training steps; LIMIT (default 240) the seconds each run may take. With
# SOCK set to a running helper's socket, that helper serves the run; else the
# script starts its own. Logs in build/gpu/ddp (and $OUT/ddp-logs.tgz);
# summary.txt holds the table.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: ddp.sh GPUCR_PREFIX" "$@"
STEPS=${STEPS:-120}
LIMIT=${LIMIT:-240}
fresh_logs build/gpu/ddp
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1

save() { [ -n "${OUT:-}" ] && tar -czf "$OUT/ddp-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null; }
HELPER=
finish() {
	save
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null
	pkill -9 -f tests/gpu/ddp.py 2>/dev/null
}
trap finish EXIT

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
note "## DDP, 2 ranks: plain and under gpucr run"
note_host "$(python3 -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)"
if [ "$ngpu" -lt 2 ]; then
	note "SKIP: $ngpu GPU (needs 2)"
	exit 0
fi

if [ -z "${SOCK:-}" ]; then
	SOCK=/run/gpucr/ddp-helper.sock
	start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info || bad "the helper did not answer"
fi

# run NAME [gpucr]: one training run, its lines to $LOGS/NAME.txt; prints its seconds.
run() {
	local name=$1 t0 t1 rc
	local cmd=(torchrun --standalone --nproc-per-node 2 tests/gpu/ddp.py "$LOGS/$name.txt" "$STEPS")
	[ "${2:-}" = gpucr ] && cmd=("$GPUCR" run --socket "$SOCK" -- "${cmd[@]}")
	t0=$(now)
	timeout -k 10 "$LIMIT" setsid "${cmd[@]}" </dev/null >"$LOGS/$name.out" 2>&1
	rc=$?
	t1=$(now)
	echo "$rc $(span "$t0" "$t1")"
}
# watch_status NAME: gpucr status once the run is 10 steps in (the ranks
# registered, what they hold, why they are not checkpointable), or nothing if
# it never gets there.
watch_status() {
	for _ in $(seq $((LIMIT * 5))); do
		if [ "$(steps "$1")" -ge 10 ]; then
			"$GPUCR" status --socket "$SOCK" >"$LOGS/$1.status" 2>&1
			return
		fi
		sleep 0.2
	done
}
# steps NAME: the step lines NAME's run has printed so far (0 before its file exists).
steps() {
	local n
	n=$(grep -c '^step' "$LOGS/$1.txt" 2>/dev/null)
	echo "${n:-0}"
}

read -r rc_plain t_plain < <(run plain)
note "plain: exit $rc_plain, $t_plain, $(steps plain) steps"
watch_status gpucr &
WATCH=$!
read -r rc_gpucr t_gpucr < <(run gpucr gpucr)
kill $WATCH 2>/dev/null
wait $WATCH 2>/dev/null
note "gpucr run: exit $rc_gpucr, $t_gpucr, $(steps gpucr) steps"
[ "$rc_plain" = 0 ] || bad "the plain run failed (exit $rc_plain): $(tail -3 "$LOGS/plain.out")"
[ "$rc_gpucr" = 0 ] || bad "the run under gpucr failed (exit $rc_gpucr): $(grep -v '^gpucr:' "$LOGS/gpucr.out" | tail -2 | tr '\n' ' ')"
n_plain=$(steps plain)
if [ "$n_plain" -ne "$STEPS" ]; then
	bad "the plain run printed $n_plain of $STEPS steps"
elif cmp -s <(grep '^step' "$LOGS/plain.txt") <(grep '^step' "$LOGS/gpucr.txt"); then
	note "losses and gradient norms: identical over $STEPS steps (last: $(grep '^step' "$LOGS/gpucr.txt" | tail -1))"
else
	bad "the run under gpucr printed other lines: $(diff <(grep '^step' "$LOGS/plain.txt") <(grep '^step' "$LOGS/gpucr.txt") | head -4 | tr '\n' ' ')"
fi
note "while training (gpucr status):"
sed 's/^/    /' "$LOGS/gpucr.status" 2>/dev/null | grep -iv '^ *$' | head -20 | tee -a "$LOGS/summary.txt" >/dev/null
note "gpucr warnings: $(grep '^gpucr:' "$LOGS/gpucr.out" | sort | uniq -c | sort -rn | head -5 | tr '\n' ';')"
note "NCCL warnings: plain $(grep -c 'NCCL WARN' "$LOGS/plain.out"), gpucr $(grep -c 'NCCL WARN' "$LOGS/gpucr.out") $(grep 'NCCL WARN' "$LOGS/gpucr.out" | head -2 | tr '\n' ';')"
exit $fail
