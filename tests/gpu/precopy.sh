#!/usr/bin/env bash
# What pre-copy saves a dump's stop, on the GPU machine:
#
#   bash tests/gpu/precopy.sh GPUCR_PREFIX CRIU_BUNDLE [GB]
#
# tests/gpu/stall_job.py holding GB (default 8) of GPU memory of which one
# 256 MB buffer keeps changing (--hot=1) runs under gpucr. It is dumped
# (the process ends) and restored, first plainly, then with --pre-copy 4;
# for each the summary gives the dump's stop (CRIU's phases), the time from
# the restore command to the restored job's next step, their sum (the
# downtime of a migration, whose target need not wait for the source's pids
# to be free), the dump's GPU copy and the rounds' copies. Every restored
# heartbeat must equal the original's, and the image directory must hold
# the GPU memory once (the rounds folded into it). Images in /dev/shm; logs in
# build/gpu/precopy (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: precopy.sh GPUCR_PREFIX CRIU_BUNDLE [GB]" "$@"
GB=${3:-8}
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/precopy
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-precopy
SOCK=/run/gpucr-precopy/helper.sock
trap 'pkill -9 -f "$JOB" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
rm -rf "$IMG" && mkdir -p "$IMG"
note_host
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" || { bad "helper"; exit 1; }
L=$LOGS/job.log
setsid "$GPUCR" run --socket "$SOCK" -- $PY "$JOB" "$GB" "$L" --hot=1 </dev/null >"$LOGS/job.out" 2>&1 &
for _ in $(seq 1800); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
P=$(grep -o 'pid=[0-9]*' "$L" | head -1 | cut -d= -f2)
[ -n "$P" ] || { bad "the job did not start"; exit 1; }
sleep 3
for mode in plain pre-copy; do
	flags=()
	[ "$mode" = pre-copy ] && flags=(--pre-copy 4)
	D=$IMG/$mode
	t0=$(now)
	"$GPUCR" checkpoint "$P" -D "$D" "${flags[@]}" --socket "$SOCK" --json >"$LOGS/$mode-dump.json" 2>&1 || { bad "$mode dump: $(tail -n 3 "$LOGS/$mode-dump.json")"; break; }
	t1=$(now)
	n=$(grep -c '^st' "$L")
	mark=$(grep -c '^hb' "$L")
	"$GPUCR" restore -D "$D" --socket "$SOCK" --json >"$LOGS/$mode-restore.json" 2>&1 || { bad "$mode restore: $(tail -n 3 "$LOGS/$mode-restore.json")"; break; }
	for _ in $(seq 1000); do [ "$(grep -c '^st' "$L")" -gt "$n" ] && break; sleep 0.01; done
	t2=$(now)
	sleep 2
	$PY - "$L" "$LOGS/$mode-dump.json" "$t0" "$t1" "$t2" "$mark" "$mode" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, sys
log, rep, t0, t1, t2, mark, mode = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6]), int(sys.argv[6]), sys.argv[7]
ts = [float(l.split()[2]) for l in open(log) if l.startswith("st ")]
last = max(t for t in ts if t <= t1)  # the job's last step before the dump stopped it
nxt = min(t for t in ts if t > t1)  # its first step after the restore
r = json.loads(open(rep).read().strip().splitlines()[-1])
pre = r.get("pre_copy") or []
rounds = ", ".join(f"{x['copied_bytes'] / 2**30:.2f}" for x in pre) or "-"
gpu = r.get("gpu") or {}
hb = [l.split() for l in open(log) if l.startswith("hb ")]
orig = {}
for h in hb[:mark]:
    orig.setdefault(h[1], h[3])
after = hb[mark:]
exact = bool(after) and all(orig.get(h[1], h[3]) == h[3] for h in after)
ph = {p["name"]: p["seconds"] for p in r.get("phases") or []}
stop = sum(ph.get(k, 0) for k in ("criu-start", "criu-dump", "criu-finish"))
# On one machine the restore must wait for the dumped pids to be free (their
# zombies reaped: slow here); a migration's target does not, so the
# downtime counts the dump's stop and the restore, not that wait.
print(f"{mode}: downtime {stop + nxt - t1:.3f} s (the dump's stop {stop:.3f} s, then the restore command to the job's next step "
      f"{nxt - t1:.3f} s; the pids were free {ph.get('pids-released', 0):.3f} s after the dump); the dump's GPU copy "
      f"{gpu.get('bytes_moved', 0) / 2**30:.2f} GiB; pre-copy rounds {rounds} GiB in {r.get('pre_copy_seconds', 0):.2f} s; "
      f"exact: {'yes' if exact else 'NO'}")
PYEOF
	# The rounds' chunks are folded into the image once it is committed: the
	# directory holds the GPU memory once (du counts a hard link once).
	note "$mode: image on disk $(du -sm "$D" | cut -f1) MiB ($(du -sm "$D/gpucr" 2>/dev/null | cut -f1) MiB of it GPU image); pre-copy rounds left: $(ls -d "$D"/gpucr-pre-copy* 2>/dev/null | wc -l)"
	P=$(pgrep -f "$JOB" | head -1)
	rm -rf "$D"
done
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/precopy.txt"
exit $fail
