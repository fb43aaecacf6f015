#!/usr/bin/env bash
# Whether compressing a training job's checkpoints pays, on the GPU machine:
#
#   bash tests/gpu/compress.sh GPUCR_PREFIX
#
# tests/gpu/stall_job.py --train (a transformer LM, AdamW, bf16 autocast,
# about 11 GB) runs under gpucr. It gets a series of GPU-only leave-running
# checkpoints, each against the one before (--auto-parent: only chunks that
# changed are stored), two plain and then one with --compress (zstd, on the
# helper's CPUs); the summary gives for each the GPU memory, the bytes
# stored, and how long it took and stopped the job. Images in /dev/shm; logs
# in build/gpu/compress (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: compress.sh GPUCR_PREFIX" "$@"
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/compress
IMG=/dev/shm/gpucr-compress
SOCK=/run/gpucr-compress/helper.sock
trap 'pkill -9 -f "$JOB" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
rm -rf "$IMG" && mkdir -p "$IMG"
note_host
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" || { bad "helper"; exit 1; }
L=$LOGS/train.log
setsid "$GPUCR" run --socket "$SOCK" -- $PY "$JOB" 0 "$L" --train </dev/null >"$LOGS/train.out" 2>&1 &
for _ in $(seq 1800); do grep -q '^hb 20 ' "$L" 2>/dev/null && break; sleep 0.1; done
P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
[ -n "$P" ] || { bad "the job did not start: $(tail -n 5 "$LOGS/train.out")"; exit 1; }
k=0
for how in plain plain compress; do
	k=$((k + 1))
	flags=()
	[ "$how" = compress ] && flags=(--compress)
	"$GPUCR" checkpoint "$P" -D "$IMG/$k" --gpu-only --leave-running --auto-parent "${flags[@]}" --socket "$SOCK" --json \
		>"$LOGS/ckpt-$k.json" 2>&1 || { bad "checkpoint $k ($how): $(tail -n 3 "$LOGS/ckpt-$k.json")"; continue; }
	$PY - "$LOGS/ckpt-$k.json" "$k" "$how" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, sys
text, k, how = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
r = json.loads(text[text.index("{"):])
ph = {p["name"]: p["seconds"] for p in r.get("phases") or []}
stop = sum(v for n, v in ph.items() if n not in ("commit", "background-copy"))
b, s = int(r.get("bytes", 0)), int(r.get("stored_bytes", 0))
print(f"checkpoint {k} ({how}): {b / 2**30:.2f} GiB of GPU memory, {s / 2**30:.2f} GiB stored ({b / max(s, 1):.2f}x), "
      f"{int(r.get('bytes_moved', 0)) / 2**30:.2f} GiB copied; took {r.get('total_seconds', 0):.2f} s (commit {ph.get('commit', 0):.2f} s)")
PYEOF
	sleep 3
done
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/compress.txt"
exit $fail
