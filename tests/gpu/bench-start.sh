#!/usr/bin/env bash
# The start of an inference server that loads GIB (default 8.6) GiB of bf16
# weights from a safetensors file onto the GPU, warms up and answers HTTP
# (tests/gpu/bench_start.py): seconds from the process's start to its first
# answer, plain against `gpucr run` and `gpucr run` with the helper's
# allocation pool (`pool`: --alloc-pool POOL, default 256M; POOL=0 leaves that
# mode out), in PAIRS (default 10) interleaved rounds:
#
#   bash tests/gpu/bench-start.sh GPUCR_PREFIX
#
# The weights file is written once to WEIGHTS (default /dev/shm/gpucr-bench-weights.safetensors,
# so that the disk is not what is timed) and kept. Every run's answer (the
# warm-up's checksum) must be the same. DEADLINE (seconds, default 540): no
# round starts after it; the table is made of the rounds that finished.
# Logs in build/gpu/start (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: bench-start.sh GPUCR_PREFIX" "$@"
PAIRS=${PAIRS:-10}
GIB=${GIB:-8.6}
POOL=${POOL:-256M}
WEIGHTS=${WEIGHTS:-/dev/shm/gpucr-bench-weights.safetensors}
fresh_logs build/gpu/start
[ -s "$WEIGHTS" ] || python3 tests/gpu/bench_start.py make "$WEIGHTS" --gib "$GIB" >"$LOGS/make.txt" 2>&1 || {
	bad "writing the weights: $(tail -2 "$LOGS/make.txt")"
	exit 1
}
HELPER=
helper() { # helper [FLAGS]: a helper of its own for one mode
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null && wait "$HELPER" 2>/dev/null
	start_helper "$GPUCR" /run/gpucr/start.sock "$LOGS/helper.log" "$@"
}
trap '[ -n "$HELPER" ] && kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && tar -czf "$OUT/start-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
# ask URL: the server's answer, if it answers (curl where there is one).
ask() {
	if command -v curl >/dev/null; then
		curl -sf "$1" 2>/dev/null
	else
		python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=1).read().decode().strip())' "$1" 2>/dev/null
	fi
}
# start MODE ROUND: one server start; prints the seconds to its first answer.
start() {
	local port=$((18000 + RANDOM % 1000)) pre=() t0 pid ans=""
	case $1 in
	gpucr) helper && pre=("$GPUCR" run --socket /run/gpucr/start.sock --) ;;
	pool) helper --alloc-pool "$POOL" && pre=("$GPUCR" run --socket /run/gpucr/start.sock --) ;;
	esac
	t0=$(now)
	BENCH_T0=$t0 setsid "${pre[@]}" python3 tests/gpu/bench_start.py serve "$WEIGHTS" "$port" >"$LOGS/$1.$2.out" 2>&1 &
	pid=$!
	for _ in $(seq 3000); do
		ans=$(ask "http://127.0.0.1:$port/") && break
		kill -0 $pid 2>/dev/null || break
		sleep 0.02
	done
	python3 -c "print(f'{$(now) - $t0:.3f}')"
	echo "$ans" >"$LOGS/$1.$2.answer"
	kill -- -$pid 2>/dev/null
	wait $pid 2>/dev/null
}
modes="plain gpucr"
[ "$POOL" != 0 ] && modes="plain gpucr pool"
DEADLINE=${DEADLINE:-540}
T_END=$(($(date +%s) + DEADLINE))
done_rounds=0
for r in $(seq "$PAIRS"); do
	if [ $(($(date +%s) + 30)) -ge $T_END ]; then
		note "DEADLINE: stopped before round $r"
		break
	fi
	order=$modes
	[ $((r % 2)) = 0 ] && order=$(echo "$modes" | tr ' ' '\n' | tac | xargs)
	for m in $order; do
		start "$m" "$r" >"$LOGS/$m.$r.seconds"
	done
	done_rounds=$r
done
PAIRS=$done_rounds
note "## Server start to first answer ($GIB GiB of weights from $WEIGHTS)"
note_host "$PAIRS interleaved rounds"
python3 - "$LOGS" "$PAIRS" "$modes" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import statistics, sys
logs, pairs, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def vals(m, what):
    out = []
    for r in range(1, pairs + 1):
        try:
            out.append(open(f"{logs}/{m}.{r}.{what}").read().strip())
        except OSError:
            pass
    return out
answers = {a for m in modes for a in vals(m, "answer")}
base = statistics.median(float(x) for x in vals("plain", "seconds"))
plain = [float(x) for x in vals("plain", "seconds")]
print("\n| mode | seconds to the first answer, median (min-max) | against plain | median of round ratios (min-max) |")
print("|---|---|---|---|")
for m in modes:
    v = [float(x) for x in vals(m, "seconds")]
    ratios = [y / x for x, y in zip(plain, v)]
    print(f"| {m} | {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) | {statistics.median(v) / base - 1:+.1%} | "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
# where the time goes: each phase's length (phase lines of bench_start.py), median over the rounds
names = ["python", "torch", "cuda", "load", "warmup"]
def phases(m, r):
    ends = {}
    try:
        for ln in open(f"{logs}/{m}.{r}.out"):
            f = ln.split()
            if len(f) == 3 and f[0] == "phase":
                ends[f[1]] = float(f[2])
    except OSError:
        return None
    if set(names) - set(ends):
        return None
    out, prev = [], 0.0
    for n in names:
        out.append(ends[n] - prev)
        prev = ends[n]
    return out
print("\n| mode | " + " | ".join(f"{n}, s" for n in names) + " | answer after warm-up, s |")
print("|---|" + "---|" * (len(names) + 1))
for m in modes:
    rows = []
    for r in range(1, pairs + 1):
        p = phases(m, r)
        try:
            total = float(open(f"{logs}/{m}.{r}.seconds").read())
        except (OSError, ValueError):
            continue
        if p:
            rows.append(p + [total - sum(p)])
    if rows:
        print(f"| {m} | " + " | ".join(f"{statistics.median(c):.3f}" for c in zip(*rows)) + " |")
print(f"\nanswers: {'all the same' if len(answers) == 1 and '' not in answers else answers}")
PYEOF
exit $fail
