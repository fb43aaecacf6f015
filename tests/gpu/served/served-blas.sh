#!/usr/bin/env bash
# Served mode's cuBLAS and cuBLASLt on the GPU machine, against NVIDIA's
# libraries (the nvidia-cublas wheel that python3 finds, or CUBLAS_LIB_DIR):
#
#   bash tests/gpu/served/served-blas.sh GPUCR_PREFIX
#
# 1. blastest --nvidia: the simulated cuBLAS's checks, on NVIDIA's (what the
#    simulation assumes of cuBLAS's errors and results);
# 2. blasbeat plain and served (gpucr run --served), for each of CASES: the
#    same done line (cuBLAS's and cuBLASLt's calls ran in the worker, on
#    NVIDIA's libraries; PyTorch-style descriptors per call, CUDA graphs,
#    device scalars); then blastest --nvidia --served, served: its checks
#    answered through served mode as NVIDIA's libraries answer them (the
#    argument errors at the call);
# 3. the same served with the helper's --served-cublas (the worker loads the
#    libraries and makes a handle ahead): the same done line;
# 4. blasbench plain, under gpucr run and served, ROUNDS rounds in
#    alternating order: ns per call of a gemm and of a PyTorch-style cuBLASLt
#    product (median, min-max).
# Logs in build/gpu/served-blas (and $OUT).
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh
prefix_arg "usage: served-blas.sh GPUCR_PREFIX" "$@"
fresh_logs build/gpu/served-blas
BIN=${BIN:-build/gpu/bin}
ROUNDS=${ROUNDS:-4}
SOCK=/run/gpucr/served-blas.sock
HELPER=
trap 'kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && tar -czf "$OUT/served-blas-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
note_host
[ -x "$BIN/blasbeat" ] || gpu_apps || exit 1
[ -x "$BIN/blasbeat" ] || { bad "make gpu-apps built no blasbeat (no cuBLAS found: set CUBLAS_LIB_DIR)"; exit 1; }
dir=$(dirname "$(readlink -f "$(ldd "$BIN/blasbeat" | awk '/libcublas\.so/{print $3; exit}')")")
note "## NVIDIA's cuBLAS: $dir ($(basename "$(readlink -f "$dir/libcublas.so.13")"))"

# ---- 1 ----
timeout 300 "$BIN/blastest" --nvidia >"$LOGS/blastest.txt" 2>&1 || bad "blastest --nvidia: $(tail -3 "$LOGS/blastest.txt" | tr '\n' ' ')"
note "blastest --nvidia: $(tail -1 "$LOGS/blastest.txt")"

# ---- 2, 3 ----
cases() {
	printf '%s\n' "${CASES:-default|
lt-per-call|--lt-per-call
graph|--graph --lt-per-call
device-scalars|--device-scalars
big|--n 1024 --lt-per-call}"
}
same() { # same LABEL HELPER_FLAGS...
	local label=$1
	shift
	kill "$HELPER" 2>/dev/null
	wait "$HELPER" 2>/dev/null
	start_helper "$GPUCR" "$SOCK" "$LOGS/helper.$label.log" --log-level info --served-pool 1 "$@" || { bad "$label: the helper did not answer"; return; }
	while IFS='|' read -r name args; do
		[ -n "$name" ] || continue
		# shellcheck disable=SC2086 # args is a list of words
		p=$(timeout 300 "$BIN/blasbeat" --iters 50 --interval-ms 0 $args 2>&1 | tee "$LOGS/$name.plain" | grep '^done')
		# shellcheck disable=SC2086
		s=$(timeout 300 "$GPUCR" run --served --socket "$SOCK" -- "$BIN/blasbeat" --iters 50 --interval-ms 0 $args 2>&1 | tee "$LOGS/$name.$label" | grep '^done')
		if [ -n "$p" ] && [ "$p" = "$s" ]; then
			note "  $name ($label): same ($p)"
		else
			bad "  $name ($label): plain '$p', served '$s' ($(grep -v '^hb' "$LOGS/$name.$label" | tail -3 | tr '\n' ' '))"
		fi
	done < <(cases)
}
note "## blasbeat, plain against served"
same served
timeout 300 "$GPUCR" run --served --socket "$SOCK" -- "$BIN/blastest" --nvidia --served >"$LOGS/blastest.served.txt" 2>&1 ||
	bad "blastest --nvidia --served, served: $(tail -3 "$LOGS/blastest.served.txt" | tr '\n' ' ')"
note "blastest --nvidia --served, served: $(tail -1 "$LOGS/blastest.served.txt")"
same served-cublas --served-cublas "$dir"

# ---- 4 ----
note "## blasbench: ns per call, median over $ROUNDS rounds (min-max)"
for r in $(seq "$ROUNDS"); do
	order="plain gpucr served"
	[ $((r % 2)) = 0 ] && order="served gpucr plain"
	for m in $order; do
		case $m in
		plain) pre=() ;;
		gpucr) pre=("$GPUCR" run --socket "$SOCK" --) ;;
		served) pre=("$GPUCR" run --served --socket "$SOCK" --) ;;
		esac
		timeout 300 "${pre[@]}" "$BIN/blasbench" --calls "${CALLS:-20000}" >"$LOGS/bench.$m.$r" 2>&1 ||
			bad "blasbench $m round $r: $(tail -2 "$LOGS/bench.$m.$r" | tr '\n' ' ')"
	done
done
python3 - "$LOGS" "$ROUNDS" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import statistics, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
cost = {}
for m in ["plain", "gpucr", "served"]:
    for r in range(1, rounds + 1):
        try:
            for line in open(f"{logs}/bench.{m}.{r}"):
                f = line.split()
                if len(f) == 3 and f[0] == "cost":
                    cost.setdefault(f[1], {}).setdefault(m, []).append(float(f[2]))
        except FileNotFoundError:
            pass
for case, by in cost.items():
    cells = []
    for m in ["plain", "gpucr", "served"]:
        v = by.get(m)
        cells.append(f"{m} {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" if v else f"{m} -")
    print(f"  {case:12s} " + "  ".join(cells))
PYEOF
exit "${fail:-0}"
