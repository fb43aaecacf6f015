#!/usr/bin/env bash
# runc checkpoint / restore of a container running PyTorch on the GPU, with
# gpucr's CRIU plugin (what tests/e2e/runc_test.go does on the simulated
# driver), in one call on the GPU machine:
#
#   bash tests/gpu/runc-gpu.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR RUNC_DIR [GB]
#
# GPUCR_PREFIX: scripts/make-gpucr-bundle.sh output; CRIU_BUNDLE:
# scripts/make-criu-bundle.sh output; ANCHOR_DIR: a copy of the shared anchor
# (work.py); RUNC_DIR: a directory holding a runc binary (the machine has
# none). The container (scripts/oci-bundle.sh): the host's /usr, /etc, ...
# read-only, the NVIDIA device nodes, the helper's socket directory, the
# gpucr prefix at /gpucr (LD_PRELOAD of its interposer), work.py GB (default
# 2) writing its heartbeat to a host directory. Then `runc checkpoint` (CRIU
# with the plugin, named by the org.criu.config annotation), `runc restore`,
# and the heartbeat must go on advancing. Logs in build/gpu/runc (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: runc-gpu.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR RUNC_DIR [GB]"
prefix_criu_args "$usage" "$@"
A=${3:-}
R=${4:-}
abs_dir "$usage" C
abs_dir "$usage" A
abs_dir "$usage" R
GB=${5:-2}
export PATH="$R:$C/bin:$PATH" # runc, and the criu runc calls
# Not fresh_logs: runc's state directory (ROOT) stays from run to run.
LOGS=${LOGS:-build/gpu/runc}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
W=$LOGS/work CW=$LOGS/criu-work IMG=/dev/shm/gpucr-runc-img ROOT=$LOGS/runc-root ID=gpucr-gpu
rm -rf "$W" "$CW" "$IMG" && mkdir -p "$W" "$CW" "$IMG" "$ROOT"
: >"$LOGS/summary.txt"

# runc calls the bundle's criu from PATH (GPUCR_CRIU is not set here).
note_host "$(runc --version | head -1); $(criu --version | head -1)"
SOCK=/run/gpucr/helper.sock
mkdir -p /run/gpucr
"$G/bin/gpucr" helper --socket "$SOCK" --log-level info >"$LOGS/helper.log" 2>&1 &
HELPER=$!
trap 'runc --root "$ROOT" delete -f $ID >/dev/null 2>&1; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
for _ in $(seq 100); do "$G/bin/gpucr" status --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done

PY=$(command -v python3)
torch_container_flags
bash scripts/oci-bundle.sh -w "$G:/gpucr" -w "$W:/work" -w /run/gpucr:/run/gpucr -w "$A:/anchor" "${extra[@]}" \
	-e LD_PRELOAD=/gpucr/lib/libgpucr.so -e GPUCR_SOCKET=/run/gpucr/helper.sock \
	"$LOGS/bundle" -- /bin/sh -c "exec $PY /anchor/work.py $GB /work/w.log >>/work/out.log 2>&1" >"$LOGS/bundle.txt" 2>&1 ||
	{ bad "bundle: $(tail -2 "$LOGS/bundle.txt")"; exit 1; }
echo "libdir $G/lib/criu" >"$LOGS/criu.conf"
python3 - "$LOGS/bundle/config.json" "$LOGS/criu.conf" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c.setdefault("annotations", {})["org.criu.config"] = sys.argv[2]
json.dump(c, open(p, "w"), indent=2)
PY

runc --root "$ROOT" run -d --pid-file "$LOGS/pid1" -b "$LOGS/bundle" $ID </dev/null >"$LOGS/run.txt" 2>&1 || { bad "runc run: $(tail -3 "$LOGS/run.txt")"; exit 1; }
for _ in $(seq 900); do grep -q '^ready' "$W/w.log" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready' "$W/w.log" 2>/dev/null || { bad "work.py did not start in the container: $(tail -3 "$W/out.log")"; exit 1; }
sleep 1
"$G/bin/gpucr" status --socket "$SOCK" >"$LOGS/status.txt" 2>&1
P1=$(cat "$LOGS/pid1")
grep -q "^  $P1 " "$LOGS/status.txt" || bad "the container's process (pid $P1) is not a client of the helper: $(cat "$LOGS/status.txt")"

t0=$(now)
if ! runc --root "$ROOT" checkpoint --image-path "$IMG" --work-path "$CW" $ID >"$LOGS/checkpoint.txt" 2>&1; then
	bad "runc checkpoint: $(tail -3 "$LOGS/checkpoint.txt"; grep Error "$CW/dump.log" | tail -5)"
	cp "$CW"/*.log "$LOGS/" 2>/dev/null
	[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/runc-summary.txt" && tar -czf "$OUT/runc-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" --exclude=bundle 2>/dev/null
	exit 1
fi
t1=$(now)
n0=$(hbs "$W/w.log")
size=$(du -sb "$IMG" | cut -f1)
"$G/bin/gpucr" image verify "$IMG" >"$LOGS/verify.txt" 2>&1 || bad "gpucr image verify: $(tail -2 "$LOGS/verify.txt")"
t2=$(now)
runc --root "$ROOT" restore -d --image-path "$IMG" --work-path "$CW" --pid-file "$LOGS/pid2" -b "$LOGS/bundle" $ID </dev/null >"$LOGS/restore.txt" 2>&1 || bad "runc restore: $(tail -3 "$LOGS/restore.txt"; tail -5 "$CW/restore.log")"
t3=$(now)
t4=$(next_heartbeat "$W/w.log" "$n0")
adv=no
[ -n "$t4" ] && adv=$(checksum_advancing "$W/w.log")
[ $adv = yes ] || bad "no advancing heartbeat after runc restore"
note "| GB | runc checkpoint | image | runc restore | restore to next heartbeat | host pid before / after | checksum advancing after |"
note "|---|---|---|---|---|---|---|"
note "| $GB | $(span "$t0" "$t1") | $((size / 1000000)) MB | $(span "$t2" "$t3") | $([ -n "$t4" ] && span "$t2" "$t4" || echo never) | $P1 / $(cat "$LOGS/pid2" 2>/dev/null) | $adv |"
cp "$CW"/*.log "$LOGS/" 2>/dev/null
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/runc-summary.txt" && tar -czf "$OUT/runc-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" --exclude=bundle 2>/dev/null
exit $fail
