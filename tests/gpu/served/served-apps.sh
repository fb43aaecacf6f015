#!/usr/bin/env bash
# Served mode on the GPU machine (docs/served-mode.md): the test applications
# under `gpucr run --served`, whose driver calls a worker of the helper's
# makes, beside the same applications on the driver itself.
#
#   bash tests/gpu/served/served-apps.sh GPUCR_PREFIX
#
# 1. exactness: each case (heartbeat with two streams, with a CUDA graph, with
#    forked CPU workers; ptrchase; stormapp's threads) prints the same final
#    checksum served as plain;
# 2. start: the time from exec to a process's "ready" line (its context made,
#    its buffers allocated and filled), plain, under `gpucr run` and served
#    from the pool's pre-warmed workers (with the interposer over the served
#    library, as gpucr run --served has it, and the library alone:
#    servedlib); ROUNDS rounds in alternating order;
# 3. steady cost: callbench (tests/apps/callbench.c) and blasbench (cuBLAS's
#    gemm, a PyTorch-style cuBLASLt product) plain, under `gpucr run`
#    and served, ROUNDS rounds in alternating order: the median ns per call
#    and the added time against plain;
# 4. memory: a running heartbeat's Rss and private dirty memory, plain,
#    under `gpucr run` and served (what a CRIU dump of it would copy).
# ROUNDS (default 8), CALLS (callbench, default 200000), MODES (default
# "plain gpucr served servedlib"), EXACT (the modes the exactness part runs
# served, default "served servedlib"). Logs in
# build/gpu/served (and $OUT).
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh
prefix_arg "usage: served-apps.sh GPUCR_PREFIX" "$@"
ROUNDS=${ROUNDS:-8}
CALLS=${CALLS:-200000}
fresh_logs build/gpu/served
BIN=${BIN:-build/gpu/bin}
[ -x "$BIN/heartbeat" ] || gpu_apps || exit 1
SOCK=/run/gpucr/served-helper.sock
HELPER=
trap 'kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && tar -czf "$OUT/served-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
note_host
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info --served-pool 2 || { bad "the helper did not answer"; exit 1; }
# wait_idle N: until device 0 has N idle workers (up to 60 s)
wait_idle() {
	for _ in $(seq 600); do
		"$GPUCR" status --json --socket "$SOCK" 2>/dev/null | grep -q "\"idle\":\[$1[],]" && return 0
		sleep 0.1
	done
	bad "the pool did not get $1 idle workers: $("$GPUCR" status --socket "$SOCK" 2>&1 | grep served)"
}
wait_idle 2
# pre MODE: the command prefix of MODE
pre() {
	case $1 in
	plain) ;;
	gpucr) echo "$GPUCR run --socket $SOCK --" ;;
	served) echo "$GPUCR run --served --socket $SOCK --" ;;
	# the served library alone, without the interposer over it (no
	# checkpoints): what forwarding itself costs
	servedlib) echo "env LD_LIBRARY_PATH=$G/lib/served GPUCR_SOCKET=$SOCK" ;;
	esac
}

# ---- 1. exactness ----
note "## exactness: the final checksum, plain and served (40 iterations)"
cases=(
	"heartbeat --mib 24 --buffers 7"
	"heartbeat --graph --mib 16 --buffers 5"
	"heartbeat --workers 2 --mib 8 --buffers 3"
	"ptrchase --mib 8"
	"stormapp --threads 3 --rounds 200 --live 8 --max-kib 3072 --seed 5"
)
for c in "${cases[@]}"; do
	read -r -a argv <<<"$c"
	name=${argv[0]}
	extra=(--iters 40 --interval-ms 0)
	[ "$name" = stormapp ] && extra=()
	# stormapp's bytes_max (its threads' high-water mark) varies from run to
	# run, plain ones too: the rest of its line is compared
	p=$(timeout 300 "$BIN/$name" "${argv[@]:1}" "${extra[@]}" 2>&1 | tee "$LOGS/exact.$name.plain" | grep -E '^done|errors=' | tail -1 | sed 's/ bytes_max=[0-9]*//')
	for m in ${EXACT:-served servedlib}; do
		# shellcheck disable=SC2046 # pre is a list of words
		s=$(timeout 300 $(pre "$m") "$BIN/$name" "${argv[@]:1}" "${extra[@]}" 2>&1 | tee "$LOGS/exact.$name.$m" | grep -E '^done|errors=' | tail -1 | sed 's/ bytes_max=[0-9]*//')
		if [ -n "$p" ] && [ "$p" = "$s" ]; then
			note "  $c ($m): same ($p)"
		else
			bad "  $c ($m): plain '$p', served '$s' ($(grep -m2 'gpucr' "$LOGS/exact.$name.$m" | tr '\n' ' '))"
		fi
	done
done

# ---- 2. start ----
# start_s MODE R: seconds from exec to heartbeat's "ready" line
start_s() {
	local log=$LOGS/start.$1.$2 t0 t1
	wait_idle 2 >/dev/null
	t0=$(now)
	# shellcheck disable=SC2046
	timeout 120 $(pre "$1") "$BIN/heartbeat" --mib 256 --buffers 8 --iters 1 --interval-ms 0 >"$log" 2>&1 &
	local p=$!
	for _ in $(seq 12000); do
		grep -q '^ready' "$log" 2>/dev/null && break
		sleep 0.005
	done
	t1=$(now)
	wait $p
	python3 -c "print(f'{$t1-$t0:.4f}')"
}
# ---- 3. steady cost ----
modes=${MODES:-plain gpucr served servedlib}
for r in $(seq "$ROUNDS"); do
	order=$modes
	[ $((r % 2)) = 0 ] && order=$(echo "$modes" | tr ' ' '\n' | tac | xargs)
	for m in $order; do
		echo "$m $(start_s "$m" "$r")" >>"$LOGS/start.txt"
		# shellcheck disable=SC2046
		timeout 300 $(pre "$m") "$BIN/callbench" --calls "$CALLS" >"$LOGS/calls.$m.$r" 2>&1 ||
			bad "callbench $m round $r: $(tail -2 "$LOGS/calls.$m.$r" | tr '\n' ' ')"
		# cuBLAS and cuBLASLt (blasbench): served mode forwards them itself, so not under servedlib
		if [ -x "$BIN/blasbench" ] && [ "$m" != servedlib ]; then
			# shellcheck disable=SC2046
			timeout 300 $(pre "$m") "$BIN/blasbench" --calls "${BLAS_CALLS:-20000}" >>"$LOGS/calls.$m.$r" 2>&1 ||
				bad "blasbench $m round $r: $(tail -2 "$LOGS/calls.$m.$r" | tr '\n' ' ')"
		fi
	done
done
python3 - "$LOGS" "$ROUNDS" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import statistics, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
modes = [m for m in ["plain", "gpucr", "served", "servedlib"] if any(l.startswith(m + " ") for l in open(f"{logs}/start.txt"))]
st = {m: [] for m in modes}
for line in open(f"{logs}/start.txt"):
    m, s = line.split()
    st[m].append(float(s))
print(f"## start to ready (heartbeat, 256 MiB in 8 buffers; {rounds} rounds, alternating): median (min-max) s")
for m in modes:
    v = st[m]
    if v:
        print(f"  {m:7s} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})  {statistics.median(v)/statistics.median(st['plain']):.2f}x plain")
cost = {}
for m in modes:
    for r in range(1, rounds + 1):
        try:
            for line in open(f"{logs}/calls.{m}.{r}"):
                f = line.split()
                if len(f) == 3 and f[0] == "cost" and f[2] != "-":
                    cost.setdefault(f[1], {}).setdefault(m, []).append(float(f[2]))
        except FileNotFoundError:
            pass
print(f"## callbench: ns per call, median over {rounds} rounds (min-max); added against plain")
print(f"  {'case':18s} " + " ".join(f"{m:>26s}" for m in modes))
for case, by in cost.items():
    base = statistics.median(by["plain"]) if by.get("plain") else None
    cells = []
    for m in modes:
        v = by.get(m)
        if not v:
            cells.append(f"{'refused/failed':>26s}")
            continue
        med = statistics.median(v)
        add = f" {med-base:+.0f}" if base is not None and m != "plain" else ""
        cells.append(f"{med:9.0f} ({min(v):.0f}-{max(v):.0f}){add:>7s}")
    print(f"  {case:18s} " + " ".join(cells))
PYEOF

# ---- 4. memory ----
note "## memory of a running heartbeat (256 MiB on the GPU in 8 buffers): Rss / private dirty MiB"
for m in $modes; do
	log=$LOGS/mem.$m
	# no timeout(1) here: the process measured must be the application
	# (gpucr run execs it); it is killed below
	# shellcheck disable=SC2046
	$(pre "$m") "$BIN/heartbeat" --mib 256 --buffers 8 --iters 100000 --interval-ms 50 >"$log" 2>&1 &
	p=$!
	for _ in $(seq 600); do grep -q '^hb' "$log" 2>/dev/null && break; sleep 0.05; done
	read -r rss pd < <(awk '/^Rss:/{r=$2} /^Private_Dirty:/{d=$2} END{printf "%.0f %.0f\n", r/1024, d/1024}' "/proc/$p/smaps_rollup")
	maps=$(grep -c -E 'libcuda\.so\.[0-9]+\.|/dev/nvidia' "/proc/$p/maps")
	note "  $m: $rss / $pd (driver mappings: $maps)"
	kill "$p" 2>/dev/null
	wait "$p" 2>/dev/null
done
exit $fail
