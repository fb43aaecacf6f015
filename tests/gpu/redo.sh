#!/usr/bin/env bash
# A concurrent checkpoint taken again, on the GPU machine:
#
#   bash tests/gpu/redo.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]
#
# ptrchase writes DATA_MIB (default 256) through pointers it loads from a
# table, which no launch names, beside STILL_MIB (default 2048) that it
# never writes. Under a helper with --concurrent-mode copy-on-write, each
# `gpucr checkpoint --leave-running --concurrent` finds its window's
# speculation wrong (the hash check) and is taken again stop-the-world; the
# summary gives, for each of 3 checkpoints, what the second stop copied and
# how long the process stood still. With BASE_PREFIX (an earlier build) the
# same runs again with it. The last image of each build is restored after
# the process is killed: every heartbeat after the restore must equal the
# original run's. Images in /dev/shm; logs in build/gpu/redo (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: redo.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]" "$@"
BASE=${3:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
DATA=${DATA_MIB:-256}
STILL=${STILL_MIB:-2048}
# A heartbeat checksums all the memory on the CPU (about 1.5 GB/s): rarely.
HB=${HB_EVERY:-25}
PY=${PYTHON:-python3}
fresh_logs build/gpu/redo
use_criu "$C" || exit 1
APP=$(pwd)/build/gpu/bin/ptrchase
gpu_apps || exit 1
IMG=/dev/shm/gpucr-redo
SOCK=/run/gpucr-redo/helper.sock
trap 'pkill -9 -f "$APP" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
note_host "ptrchase --mib $DATA --still-mib $STILL"

# run NAME PREFIX: the three checkpoints and the restore with build PREFIX.
run() {
	local name=$1 g=$2/bin/gpucr
	rm -rf "$IMG" && mkdir -p "$IMG"
	start_helper "$g" "$SOCK" "$LOGS/$name-helper.log" --concurrent-mode copy-on-write || { bad "$name: helper"; return; }
	local L=$LOGS/$name-app.log
	setsid "$g" run --socket "$SOCK" -- "$APP" --mib "$DATA" --still-mib "$STILL" --buffers 8 --hb-every "$HB" --interval-ms 10 \
		</dev/null >>"$L" 2>"$LOGS/$name-app.err" &
	for _ in $(seq 600); do [ "$(grep -c '^hb' "$L" 2>/dev/null)" -ge 2 ] && break; sleep 0.1; done
	local P
	P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
	[ -n "$P" ] || { bad "$name: ptrchase did not start: $(tail -n 3 "$LOGS/$name-app.err")"; kill $HELPER; return; }
	for k in 1 2 3; do
		sleep 1
		"$g" checkpoint "$P" -D "$IMG/$k" --leave-running --concurrent --socket "$SOCK" --json >"$LOGS/$name-ckpt-$k.json" 2>&1 ||
			bad "$name checkpoint $k: $(tail -n 3 "$LOGS/$name-ckpt-$k.json")"
		$PY - "$LOGS/$name-ckpt-$k.json" "$name" "$k" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, sys
text, name, k = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
r = json.loads(text[text.rindex("\n{") + 1:] if "\n{" in text else text)
g = r.get("gpu") or {}
print(f"{name} checkpoint {k}: {'taken again' if r.get('redone') else 'NOT taken again'}; the second stop copied "
      f"{g.get('bytes_moved', 0) / 2**20:.0f} of {g.get('total_bytes', 0) / 2**20:.0f} MiB; the process stood still "
      f"{r.get('stall_seconds', 0):.3f} s; the command took {r.get('seconds', 0):.2f} s")
PYEOF
	done
	restore_after_kill "$g" "$SOCK" "$IMG/3" "$L" "$P" "$APP" "$name"
	kill $HELPER 2>/dev/null
	wait $HELPER 2>/dev/null
}

run new "$G"
[ -n "$BASE" ] && run base "$BASE"
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/redo.txt"
exit $fail
