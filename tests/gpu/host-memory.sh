#!/usr/bin/env bash
# Where a restore's host memory comes from: the pages CRIU writes back
# before a restored GPU process runs, on the GPU machine.
#
#   bash tests/gpu/host-memory.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB]
#
# The anchor's work.py (GB, default 8) under `gpucr run`: its anonymous
# memory by mapping (/proc/PID/smaps: the largest, and the totals) while it
# runs; again while `gpucr checkpoint --gpu-only` leaves it checkpointed
# (NVIDIA's driver has parked the residual context's state in the process's
# memory then); then, after `gpucr resume`, a CRIU dump (`gpucr checkpoint`),
# the size of its page images. Also the kernel's transparent huge page
# settings (a fault per 4 KiB page is most of what CRIU's restore of host
# memory costs). Logs in build/gpu/host-memory (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: host-memory.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB]"
prefix_criu_args "$usage" "$@"
A=${3:?$usage}
A=$(cd "$A" && pwd)
GB=${4:-8}
PY=${PYTHON:-python3}
fresh_logs build/gpu/host-memory
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-host-memory
SOCK=/run/gpucr-host-memory/helper.sock
trap 'pkill -9 -f "$A/work.py" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
note "THP: enabled $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"

# smaps PID WHAT: the anonymous memory of PID by mapping, one summary.
smaps() {
	$PY - "$1" "$2" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
pid, what = sys.argv[1], sys.argv[2]
maps, cur = [], None
for line in open(f"/proc/{pid}/smaps"):
    f = line.split()
    if "-" in f[0] and len(f) >= 5 and ":" not in f[0]:
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        cur = {"range": f[0], "size": hi - lo, "perms": f[1], "path": " ".join(f[5:]) or "[anon]", "Anonymous": 0, "Rss": 0,
               "AnonHugePages": 0, "Private_Dirty": 0}
        maps.append(cur)
    elif cur is not None and f[0].rstrip(":") in cur and len(f) >= 2:
        cur[f[0].rstrip(":")] = int(f[1]) * 1024
mib = lambda b: f"{b / 2**20:.0f} MiB"
anon = sum(m["Anonymous"] for m in maps)
dirty = sum(m["Private_Dirty"] for m in maps)
huge = sum(m["AnonHugePages"] for m in maps)
print(f"{what}: {len(maps)} mappings, anonymous {mib(anon)} (in huge pages {mib(huge)}), private dirty {mib(dirty)}, "
      f"resident {mib(sum(m['Rss'] for m in maps))}")
byname = {}
for m in maps:
    byname.setdefault(m["path"], [0, 0])
    byname[m["path"]][0] += m["Private_Dirty"]
    byname[m["path"]][1] += 1
for name, (d, n) in sorted(byname.items(), key=lambda kv: -kv[1][0])[:8]:
    print(f"  {what}: {mib(d)} private dirty in {n} mappings of {name}")
for m in sorted(maps, key=lambda m: -m["Private_Dirty"])[:6]:
    print(f"  {what}: largest: {m['range']} {m['perms']} {mib(m['size'])}, {mib(m['Private_Dirty'])} dirty, {m['path']}")
PYEOF
}

start_helper "$G/bin/gpucr" "$SOCK" "$LOGS/helper.log" || { bad "helper"; exit 1; }
rm -rf "$IMG" && mkdir -p "$IMG"
L=$LOGS/work.log
setsid "$G/bin/gpucr" run --socket "$SOCK" -- $PY "$A/work.py" "$GB" "$L" </dev/null >"$LOGS/work.out" 2>&1 &
for _ in $(seq 1200); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
[ -n "$P" ] || { bad "work.py did not start: $(tail -n 3 "$LOGS/work.out")"; exit 1; }
sleep 1
smaps "$P" running
if "$G/bin/gpucr" checkpoint "$P" -D "$IMG/g" --gpu-only --socket "$SOCK" >"$LOGS/gpu-only.txt" 2>&1; then
	smaps "$P" checkpointed
	"$G/bin/gpucr" resume "$P" --socket "$SOCK" >"$LOGS/resume.txt" 2>&1 || bad "resume: $(tail -n 2 "$LOGS/resume.txt")"
else
	bad "checkpoint --gpu-only: $(tail -n 3 "$LOGS/gpu-only.txt")"
fi
sleep 1
if "$G/bin/gpucr" checkpoint "$P" -D "$IMG/c" --socket "$SOCK" >"$LOGS/dump.txt" 2>&1; then
	note "CRIU dump: page images $(du -cb "$IMG"/c/pages-*.img | tail -1 | awk '{printf "%.0f MiB", $1/2^20}') in $(ls "$IMG"/c/pages-*.img | wc -l) files; GPU image $(du -sb "$IMG/c/gpucr" | awk '{printf "%.0f MiB", $1/2^20}')"
else
	bad "dump: $(tail -n 3 "$LOGS/dump.txt")"
fi
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/host-memory.txt"
exit $fail
