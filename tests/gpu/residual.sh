#!/usr/bin/env bash
# What NVIDIA's driver checkpoint of a process's residual state costs, and
# what it grows with (tests/gpu/residual.py's modes):
#
#   bash tests/gpu/residual.sh ANCHOR_DIR [MODE...]
#
# For each mode, a process is started plainly (no gpucr), and `drvckpt lock
# checkpoint` then `drvckpt restore unlock` (the anchor's tool) run REPEAT
# times (default 3); the table gives the device memory the process holds
# (the driver's own, the caching allocator emptied) and each step's time.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
A=${1:?usage: residual.sh ANCHOR_DIR [MODE...]}
A=$(cd "$A" && pwd)
shift
MODES=${*:-bare cublas ops streams stack}
REPEAT=${REPEAT:-3}
PY=${PYTHON:-python3}
fresh_logs build/gpu/residual
gcc -O2 -I/usr/local/cuda/include -o "$LOGS/drvckpt" "$A/drvckpt.c" -L/usr/local/cuda/lib64/stubs -lcuda || exit 1
note "| mode | device memory held | lock | checkpoint | restore | unlock |"
note "|---|---|---|---|---|---|"
for m in $MODES; do
	R=$LOGS/ready-$m
	rm -f "$R"
	$PY tests/gpu/residual.py "$m" "$R" >"$LOGS/$m.out" 2>&1 &
	P=$!
	for _ in $(seq 600); do [ -s "$R" ] && break; sleep 0.1; done
	[ -s "$R" ] || { bad "$m: did not start: $(tail -n 3 "$LOGS/$m.out")"; kill -9 $P; continue; }
	for n in $(seq "$REPEAT"); do
		"$LOGS/drvckpt" lock checkpoint "$P" >"$LOGS/$m-$n.txt" 2>&1 && "$LOGS/drvckpt" restore unlock "$P" >>"$LOGS/$m-$n.txt" 2>&1 ||
			bad "$m #$n: $(tail -n 2 "$LOGS/$m-$n.txt")"
		t() { awk -v s="$1" '$2 == s {print $NF == "s" ? $(NF-1) : $NF}' "$LOGS/$m-$n.txt"; }
		note "| $m | $(cut -d= -f2 "$R") MiB | $(t lock) s | $(t checkpoint) s | $(t restore) s | $(t unlock) s |"
	done
	kill -9 $P
	wait $P 2>/dev/null
done
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/residual.txt"
exit $fail
