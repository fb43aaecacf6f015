#!/usr/bin/env bash
# The GPU half of a checkpoint, gpucr against the driver checkpoint API, on
# the anchor's PyTorch workload, in one call:
#
#   bash tests/gpu/bench-gpu-checkpoint.sh PREFIX ANCHOR_DIR [GB...]
#
# PREFIX holds bin/gpucr and lib/libgpucr.so (scripts/make-gpucr-bundle.sh);
# ANCHOR_DIR is a copy of the shared anchor (work.py, drvckpt.c). For each
# size (default 8):
#   driver API   work.py GB without gpucr; drvckpt lock+checkpoint, then
#                restore+unlock (what cuda-checkpoint and CRIU's cuda plugin
#                do): all of the GPU memory goes through the driver
#   gpucr        work.py GB under `gpucr run`; `gpucr checkpoint --gpu-only`
#                (quiesce, drain, drop, then the copy into an image in
#                /dev/shm alongside the driver lock+checkpoint of the
#                residual, commit), then
#                `gpucr resume` (driver restore+unlock, reimport, resume);
#                then once more with --leave-running
# and checks that the heartbeat checksum keeps advancing after each.
# Prints a table with the ratios; logs in build/gpu/ckpt (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: bench-gpu-checkpoint.sh PREFIX ANCHOR_DIR [GB...]"
prefix_arg "$usage" "$@"
ANCHOR=${2:?$usage}
shift 2
SIZES=${*:-8}
IMG=${IMG:-/dev/shm/gpucr-bench-img}
PY=${PYTHON:-python3}
fresh_logs build/gpu/ckpt

gcc -O2 -I/usr/local/cuda/include -o "$LOGS/drvckpt" "$ANCHOR/drvckpt.c" -L/usr/local/cuda/lib64/stubs -lcuda || exit 1
SOCK=$(mktemp -u /tmp/gpucr-ckpt.XXXXXX.sock)
"$GPUCR" helper --socket "$SOCK" --log-level info >"$LOGS/helper.log" 2>&1 &
HELPER=$!
trap 'kill $HELPER 2>/dev/null; pkill -f "$ANCHOR/work.py" 2>/dev/null; rm -rf "$IMG"' EXIT
for _ in $(seq 100); do "$GPUCR" status --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done

note_host "image dir $IMG"
# wait_ready LOG: the workload's pid once its ready line is there
wait_ready() {
	for _ in $(seq 600); do
		grep -q '^ready' "$1" 2>/dev/null && break
		sleep 0.1
	done
	grep -o 'pid=[0-9]*' "$1" | head -1 | cut -d= -f2
}
# advancing LOG: true if a new heartbeat arrives within 20 s
advancing() {
	local n0
	n0=$(grep -c '^hb' "$1")
	for _ in $(seq 200); do
		[ "$(grep -c '^hb' "$1")" -gt $((n0 + 1)) ] && return 0
		sleep 0.1
	done
	return 1
}
secs() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print('%.3f' % r.get('total_seconds', 0))" "$1"; }
phase() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print('%.3f' % sum(p['seconds'] for p in r.get('phases', []) if p['name'] == sys.argv[2]))" "$1" "$2"; }

note ""
note "| GB | driver API ckpt | driver API restore | gpucr ckpt (copy / commit / drop / residual) | gpucr resume | gpucr leave-running | image | ckpt ratio | restore ratio |"
note "|---|---|---|---|---|---|---|---|---|"
for gb in $SIZES; do
	# --- the driver checkpoint API alone
	L=$LOGS/plain-$gb.log
	rm -f "$L"
	$PY "$ANCHOR/work.py" "$gb" "$L" 2>"$LOGS/plain-$gb.err" &
	P=$(wait_ready "$L")
	advancing "$L" || bad "$gb GB plain: no heartbeat"
	"$LOGS/drvckpt" lock checkpoint "$P" >"$LOGS/drv-$gb.txt" 2>&1
	"$LOGS/drvckpt" restore unlock "$P" >>"$LOGS/drv-$gb.txt" 2>&1
	dc=$(awk '/drvckpt (lock|checkpoint) /{s+=$(NF-1)} END{printf "%.3f", s}' "$LOGS/drv-$gb.txt")
	dr=$(awk '/drvckpt (restore|unlock) /{s+=$(NF-1)} END{printf "%.3f", s}' "$LOGS/drv-$gb.txt")
	advancing "$L" || bad "$gb GB plain: no heartbeat after the driver restore"
	kill "$P"; wait "$P" 2>/dev/null

	# --- gpucr
	L=$LOGS/gpucr-$gb.log
	rm -f "$L" && rm -rf "$IMG"
	"$GPUCR" run --socket "$SOCK" -- $PY "$ANCHOR/work.py" "$gb" "$L" 2>"$LOGS/gpucr-$gb.err" &
	P=$(wait_ready "$L")
	advancing "$L" || bad "$gb GB gpucr: no heartbeat"
	"$GPUCR" checkpoint "$P" -D "$IMG" --gpu-only --json --socket "$SOCK" >"$LOGS/ckpt-$gb.json" 2>&1 || bad "$gb GB: gpucr checkpoint: $(tail -1 "$LOGS/ckpt-$gb.json")"
	size=$(du -sb "$IMG" | cut -f1)
	"$GPUCR" resume "$P" --json --socket "$SOCK" >"$LOGS/resume-$gb.json" 2>&1 || bad "$gb GB: gpucr resume: $(tail -1 "$LOGS/resume-$gb.json")"
	advancing "$L" || bad "$gb GB gpucr: no heartbeat after resume"
	rm -rf "$IMG"
	"$GPUCR" checkpoint "$P" -D "$IMG" --gpu-only --leave-running --json --socket "$SOCK" >"$LOGS/ckpt-lr-$gb.json" 2>&1 || bad "$gb GB: leave-running: $(tail -1 "$LOGS/ckpt-lr-$gb.json")"
	advancing "$L" || bad "$gb GB gpucr: no heartbeat after leave-running"
	kill "$P"; wait "$P" 2>/dev/null
	gc=$(secs "$LOGS/ckpt-$gb.json"); gr=$(secs "$LOGS/resume-$gb.json"); glr=$(secs "$LOGS/ckpt-lr-$gb.json")
	parts="$(phase "$LOGS/ckpt-$gb.json" copy) / $(phase "$LOGS/ckpt-$gb.json" commit) / $(phase "$LOGS/ckpt-$gb.json" drop) / $($PY -c "print(f'{$(phase "$LOGS/ckpt-$gb.json" driver-lock)+$(phase "$LOGS/ckpt-$gb.json" driver-checkpoint):.3f}')")"
	rc=$($PY -c "print(f'{$gc/$dc:.3f}')" 2>/dev/null || echo "?")
	rr=$($PY -c "print(f'{$gr/$dr:.3f}')" 2>/dev/null || echo "?")
	note "| $gb | $dc s | $dr s | $gc s ($parts) | $gr s | $glr s | $((size / 1000000)) MB | $rc | $rr |"
done
note ""
note "heartbeats kept advancing after every restore/resume unless a FAIL line says otherwise"
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/ckpt-summary.txt" && tar -czf "$OUT/ckpt-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
exit $fail
