#!/usr/bin/env bash
# Step times of real GPU work (tests/gpu/bench_steps.py: a launch-bound LM
# training step, a ResNet-50 training step, an LLM decode loop at batch 1,
# CUDA graph replay), plain against `gpucr run`, in interleaved pairs:
#
#   bash tests/gpu/bench-steps.sh GPUCR_PREFIX
#
# PAIRS (default 10) pairs of runs, the order alternating; a run is one
# process that times every workload of WORKLOADS (default all four) in turn;
# STEPS (default 100: 100 steps of the training steps, 1000 of the decode loop
# and the graph replay, bench_steps.py) scales the timed steps, after 10 to
# warm up. The table gives the median over the runs of each run's median
# step (min-max) and gpucr / plain; "last" says whether every run ended on the
# same value (loss or token). step-times.png (and $OUT) plots the
# distribution of every step of every run. DEADLINE (seconds, default 540)
# bounds the whole: no run starts after it, a run is cut at it, and the table
# and the plot are made of the pairs that finished (the table says how many).
# SERVED=1: the gpucr runs are `gpucr run --served` (served mode: the
# program's driver calls run in a worker of the helper's pool), so the
# table's gpucr / plain is served mode's steady cost; both sides then run
# bench_steps.py --no-cudnn (served mode does not forward cuDNN yet: PyTorch
# takes its own attention and convolution kernels), so use WORKLOADS without
# resnet50. Logs in build/gpu/steps.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: bench-steps.sh GPUCR_PREFIX" "$@"
PAIRS=${PAIRS:-10}
STEPS=${STEPS:-100}
WORKLOADS=${WORKLOADS:-lm_train resnet50 decode_b1 graph}
fresh_logs build/gpu/steps
SOCK=/run/gpucr/steps-helper.sock
HELPER=
finish() {
	kill $HELPER 2>/dev/null
	if [ -n "${OUT:-}" ]; then
		cp "$LOGS"/*.png "$OUT/" 2>/dev/null
		tar -czf "$OUT/steps-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
	fi
}
trap finish EXIT
runflags=()
pyflags=()
hflags=(--log-level info)
what="gpucr run"
if [ "${SERVED:-0}" = 1 ]; then
	runflags=(--served)
	hflags+=(--served-pool 1)
	what="gpucr run --served; both with --no-cudnn"
	pyflags=(--no-cudnn)
fi
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" "${hflags[@]}" || bad "the helper did not answer"

DEADLINE=${DEADLINE:-540}
T_END=$(($(date +%s) + DEADLINE))
for p in $(seq "$PAIRS"); do
	order="plain gpucr"
	[ $((p % 2)) = 0 ] && order="gpucr plain"
	for m in $order; do
		left=$((T_END - $(date +%s)))
		if [ $left -le 5 ]; then
			note "DEADLINE: stopped before pair $p ($m)"
			break 2
		fi
		pre=()
		[ $m = gpucr ] && pre=("$GPUCR" run "${runflags[@]}" --socket "$SOCK" --)
		# shellcheck disable=SC2086 # WORKLOADS is a list
		timeout "$left" "${pre[@]}" python3 tests/gpu/bench_steps.py $WORKLOADS --steps "$STEPS" "${pyflags[@]}" >"$LOGS/run.$m.$p" 2>"$LOGS/run.$m.$p.err"
		rc=$?
		if [ $rc = 124 ]; then
			note "DEADLINE: pair $p ($m) cut"
		elif [ $rc != 0 ]; then
			bad "pair $p ($m): exit $rc: $(grep -v '^gpucr:' "$LOGS/run.$m.$p.err" | tail -2 | tr '\n' ' ')"
		fi
	done
done

note "## Step times, plain against $what (the table's gpucr)"
note_host "$(python3 -c 'import torch; print("torch", torch.__version__)'); $PAIRS interleaved pairs, --steps $STEPS"
python3 tests/gpu/steps_table.py "$LOGS" "$PAIRS" "$WORKLOADS" | tee -a "$LOGS/summary.txt"
exit $fail
