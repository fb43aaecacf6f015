#!/usr/bin/env bash
# What forwarding kernel launches to a worker process through a shared-memory
# ring costs, beside the same launches made directly (ringbench.c says what
# each mode does and how to read the numbers), on the GPU machine:
#
#   bash tests/gpu/served/ringbench.sh [N [ROUNDS]]
#
# N launches per run (default 200000), each mode ROUNDS times (default 5, or
# $ROUNDS), the order of the modes reversed every other round so that a drift
# of the machine (clocks, another tenant) does not favour one mode. The
# table: per mode the median ns per launch over the rounds (min-max), the
# time added against direct (graph-ring against graph-direct; the nogpu rows
# are the transport alone, with nothing to add to), the worker's CPU time per
# launch. In build/gpu/served/ringbench.txt, with each run's line in
# ringbench-runs.txt; both go to $OUT too where it is set.
# RINGBENCH_CPUS=P,W (passed through) pins the producer and the worker.
set -u
cd "$(dirname "$0")/../../.." || exit 1
# NVLink multicast off, as on every GPU machine (see tests/gpu/lib.sh); this
# benchmark uses none, but whatever it starts inherits the setting.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

N=${1:-200000}
ROUNDS=${2:-${ROUNDS:-5}}
L=build/gpu/served
B=$L/ringbench
T=$L/ringbench.txt
R=$L/ringbench-runs.txt
E=$L/ringbench-err.log
mkdir -p "$L"
: >"$R"
: >"$E"
fail=0

# shellcheck disable=SC2317 # run by the EXIT trap
finish() {
	if [ -n "${OUT:-}" ]; then
		cp "$T" "$OUT/ringbench.txt" 2>/dev/null
		cp "$R" "$OUT/ringbench-runs.txt" 2>/dev/null
		[ -s "$E" ] && cp "$E" "$OUT/ringbench-err.log"
	fi
}
trap finish EXIT

if ! gcc -O2 -Wall -Wextra -pthread -Iinclude -o "$B" tests/gpu/served/ringbench.c -ldl 2>"$L/build.log"; then
	cat "$L/build.log"
	echo "FAIL: building ringbench" | tee "$T"
	exit 1
fi
[ -s "$L/build.log" ] && cat "$L/build.log" # warnings: shown, not fatal

MODES=(direct ring ring-rtt ring-nogpu ring-rtt-nogpu graph-direct graph-ring)
for ((r = 1; r <= ROUNDS; r++)); do
	order=("${MODES[@]}")
	if ((r % 2 == 0)); then
		order=()
		for ((i = ${#MODES[@]} - 1; i >= 0; i--)); do order+=("${MODES[i]}"); done
	fi
	for m in "${order[@]}"; do
		out=$(timeout 120 "$B" "$m" "$N" 2>"$L/run.err")
		rc=$?
		sed "s/^/round=$r mode=$m: /" "$L/run.err" >>"$E"
		if [ "$rc" -eq 0 ]; then
			echo "round=$r $out" >>"$R"
		else
			echo "round=$r mode=$m FAIL rc=$rc ${out:+($out) }$(tail -1 "$L/run.err")" >>"$R"
			echo "FAIL: round $r $m (rc $rc): $(tail -1 "$L/run.err")" >&2
			fail=1
		fi
	done
done
rm -f "$L/run.err"

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
{
	echo "ringbench: $N launches per run (graph rows: $((N / 64 > 0 ? N / 64 : 1)) launches of a 64-kernel graph, ns per graph launch), $ROUNDS rounds in alternating order"
	echo "host: $(nproc) cores, ${cpu:-?}; ${gpu:-no GPU}${RINGBENCH_CPUS:+; pinned producer,worker=$RINGBENCH_CPUS}"
	awk -v rounds="$ROUNDS" -v modes="${MODES[*]}" '
	function val(key,   i, kv) {
		for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == key) return kv[2] }
		return ""
	}
	# median (min-max) of the n values in a[1..n], which it sorts
	function med(a, n,   i, j, t, m) {
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		m = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		return m
	}
	{
		m = val("mode"); sub(/:$/, "", m)
		if ($0 ~ / FAIL /) next
		k = ++n[m]
		enq[m, k] = val("enqueue_ns") + 0; tot[m, k] = val("total_ns") + 0
		w = val("worker_cpu_ns"); if (w != "-" && w != "") { nw[m]++; wc[m, nw[m]] = w + 0 }
	}
	END {
		printf "%-15s %-28s %-28s %-13s %-20s %-13s %s\n", "mode", "enqueue ns (min-max)", "total ns (min-max)", "added enq", "added total", "worker CPU ns", "runs"
		cnt = split(modes, M, " ")
		for (i = 1; i <= cnt; i++) {
			m = M[i]
			if (!n[m]) { printf "%-15s %s\n", m, "no successful run"; continue }
			for (k = 1; k <= n[m]; k++) { a[k] = enq[m, k]; b[k] = tot[m, k] }
			me[m] = med(a, n[m]); mt[m] = med(b, n[m])
			se = sprintf("%.1f (%.1f-%.1f)", me[m], a[1], a[n[m]])
			st = sprintf("%.1f (%.1f-%.1f)", mt[m], b[1], b[n[m]])
			wcs = "-"
			if (nw[m]) { for (k = 1; k <= nw[m]; k++) c[k] = wc[m, k]; wcs = sprintf("%.1f", med(c, nw[m])) }
			base = (m == "ring" || m == "ring-rtt") ? "direct" : (m == "graph-ring" ? "graph-direct" : "")
			ae = "-"; at = "-"
			if (base != "" && n[base]) {
				ae = sprintf("%+.1f", me[m] - me[base])
				at = sprintf("%+.1f (%.3fx)", mt[m] - mt[base], mt[base] > 0 ? mt[m] / mt[base] : 0)
			}
			printf "%-15s %-28s %-28s %-13s %-20s %-13s %d/%d\n", m, se, st, ae, at, wcs, n[m], rounds
		}
	}' "$R"
	grep ' FAIL ' "$R"
} | tee "$T"
exit $fail
