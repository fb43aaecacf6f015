#!/usr/bin/env bash
# Write sets narrowed by the PTX analysis, on the GPU machine:
#
#   bash tests/gpu/window-narrow.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]
#
# heartbeat --still-mib 2048 runs app_hb_mix every step with 2 GiB it only
# reads (its second parameter). Under a helper with --concurrent-mode
# copy-on-write whose background copy is held back 5 s (GPUCR_FAULT=
# stall-background), `gpucr checkpoint --leave-running --concurrent` opens a
# window; 2 s into it, gpucr status must show those 2 GiB still to save (the
# launches that read them did not have them saved first), and the image,
# restored after the process is killed, must continue exactly. With
# BASE_PREFIX (a build without the analysis) the same runs again for
# comparison. Logs in build/gpu/narrow (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: window-narrow.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]" "$@"
BASE=${3:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
PY=${PYTHON:-python3}
fresh_logs build/gpu/narrow
use_criu "$C" || exit 1
APP=$(pwd)/build/gpu/bin/heartbeat
gpu_apps || exit 1
IMG=/dev/shm/gpucr-narrow
SOCK=/run/gpucr-narrow/helper.sock
trap 'pkill -9 -f "$APP" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
note_host "heartbeat --mib 256 --buffers 4 --still-mib 2048 --hb-every 25"

run() {
	local name=$1 g=$2/bin/gpucr
	rm -rf "$IMG" && mkdir -p "$IMG"
	GPUCR_FAULT=stall-background start_helper "$g" "$SOCK" "$LOGS/$name-helper.log" --concurrent-mode copy-on-write ||
		{ bad "$name: helper"; return; }
	local L=$LOGS/$name-app.log
	setsid "$g" run --socket "$SOCK" -- "$APP" --mib 256 --buffers 4 --still-mib 2048 --hb-every 25 --interval-ms 10 \
		</dev/null >>"$L" 2>"$LOGS/$name-app.err" &
	for _ in $(seq 600); do [ "$(grep -c '^hb' "$L" 2>/dev/null)" -ge 2 ] && break; sleep 0.1; done
	local P
	P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
	[ -n "$P" ] || { bad "$name: heartbeat did not start: $(tail -n 3 "$LOGS/$name-app.err")"; kill $HELPER; return; }
	"$g" checkpoint "$P" -D "$IMG/1" --leave-running --concurrent --socket "$SOCK" --json >"$LOGS/$name-ckpt.json" 2>&1 &
	local ck=$!
	for _ in $(seq 300); do grep -q 'stalling the background copy' "$LOGS/$name-helper.log" && break; sleep 0.05; done
	local h0
	h0=$(grep -c '^hb' "$L")
	sleep 2
	"$g" status --socket "$SOCK" --json >"$LOGS/$name-status.json" 2>&1
	$PY - "$LOGS/$name-status.json" "$name" "$h0" "$(grep -c '^hb' "$L")" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, re, sys
text, name, h0, h1 = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = re.search(r'"window_pending_bytes":\s*"?(\d+)', text)
pending = int(m.group(1)) if m else -1
print(f"{name}: 2 s into the window ({h1 - h0} heartbeats, 25 steps each, meanwhile), {pending / 2**20:.0f} MiB still to save "
      f"({'the 2048 MiB only read are not saved ahead of the launches' if pending >= 2048 << 20 else 'the memory only read was saved ahead'})")
PYEOF
	wait $ck || bad "$name checkpoint: $(tail -n 3 "$LOGS/$name-ckpt.json")"
	grep -q '"redone"' "$LOGS/$name-ckpt.json" && bad "$name: the checkpoint was taken again"
	restore_after_kill "$g" "$SOCK" "$IMG/1" "$L" "$P" "$APP" "$name"
	kill $HELPER 2>/dev/null
	wait $HELPER 2>/dev/null
}

run new "$G"
[ -n "$BASE" ] && run base "$BASE"
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/narrow.txt"
exit $fail
