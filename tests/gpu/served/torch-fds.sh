#!/usr/bin/env bash
# What a served PyTorch process holds of NVIDIA's: its open /dev/nvidia*
# descriptors and the NVIDIA libraries it maps (CRIU cannot dump a process
# that holds a descriptor of the driver's), and which library opened them.
#
#   bash tests/gpu/served/torch-fds.sh GPUCR_PREFIX
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh
prefix_arg "usage: torch-fds.sh GPUCR_PREFIX" "$@"
fresh_logs build/gpu/torch-fds
SOCK=/run/gpucr/torch-fds.sock
HELPER=
trap 'kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && cp "$LOGS"/* "$OUT"/ 2>/dev/null' EXIT
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --served-pool 1 || { bad "no helper"; exit 1; }
for m in served; do
	log=$LOGS/app.$m
	setsid "$GPUCR" run --served --socket "$SOCK" -- env LD_DEBUG=libs LD_DEBUG_OUTPUT=$LOGS/lddebug python3 tests/gpu/served/torch_rt.py --mib 64 --steps 100000 --interval-ms 100 </dev/null >"$log" 2>&1 &
	pid=$!
	for _ in $(seq 300); do [ "$(hbs "$log")" -ge 3 ] && break; sleep 0.1; done
	note "## $m: descriptors of the driver's"
	ls -l /proc/$pid/fd 2>/dev/null | grep -i nvidia | tee -a "$LOGS/summary.txt"
	note "## $m: NVIDIA libraries mapped"
	grep -oE '/[^ ]*(nvidia|cuda|libnv)[^ ]*' /proc/$pid/maps | sort -u | tee -a "$LOGS/summary.txt"
	kill -9 $pid
done
grep -l "libnvidia-ml\|/libcuda.so" "$LOGS"/lddebug.* 2>/dev/null | head -3 | while read -r f; do grep -n "libnvidia-ml\|find library=libcuda\|calling init: .*nvidia-ml" "$f" | head -12; done | tee -a "$LOGS/summary.txt"
