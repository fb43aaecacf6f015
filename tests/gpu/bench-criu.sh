#!/usr/bin/env bash
# Whole-process checkpoint and restore through CRIU: gpucr (plugin + helper)
# against the anchor (CRIU + the driver checkpoint API), same workload, same
# call:
#
#   bash tests/gpu/bench-criu.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB...]
#
# GPUCR_PREFIX: scripts/make-gpucr-bundle.sh output (bin/gpucr, lib/libgpucr.so,
# lib/criu/gpucr_plugin.so); CRIU_BUNDLE: scripts/make-criu-bundle.sh output;
# ANCHOR_DIR: a copy of the shared anchor (run-anchor.sh, work.py, drvckpt.c).
# For each size (default 8): the anchor's own script, then work.py under
# `gpucr run`: `gpucr checkpoint PID -D DIR` (CRIU dump with the plugin; the
# process ends), `gpucr restore -D DIR`, the time from the restore's start to
# the first heartbeat after it, and whether the checksum goes on advancing.
# Images in /dev/shm. Logs in build/gpu/criu (and $OUT).
set -u
cd "$(dirname "$0")/../.."
G=${1:?usage: bench-criu.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB...]}
C=${2:?usage}
A=${3:?usage}
shift 3
SIZES=${*:-8}
GPUCR=$G/bin/gpucr
export GPUCR_CRIU=$(cd "$C" && pwd)/bin/criu
PLUGINS=$(cd "$G/lib/criu" && pwd)
LOGS=${LOGS:-build/gpu/criu}
IMG=${IMG:-/dev/shm/gpucr-criu-img}
PY=${PYTHON:-python3}
mkdir -p "$LOGS"
: >"$LOGS/summary.txt"
fail=0
note() { printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"; }
bad() { note "FAIL: $*"; fail=1; }
now() { date +%s.%N; }

note "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $("$GPUCR_CRIU" --version | head -1)"
note ""
note "## anchor: CRIU + driver checkpoint API (shared/device/anchor/run-anchor.sh)"
if [ -z "${SKIP_ANCHOR:-}" ]; then
	bash "$A/run-anchor.sh" "$GPUCR_CRIU" $SIZES >"$LOGS/anchor.txt" 2>&1 || bad "anchor script failed"
fi
sed 's/^/    /' "$LOGS/anchor.txt" | tail -n 8 | tee -a "$LOGS/summary.txt"

SOCK=/run/gpucr/helper.sock
mkdir -p /run/gpucr
"$GPUCR" helper --socket "$SOCK" --log-level info >"$LOGS/helper.log" 2>&1 &
HELPER=$!
trap 'kill $HELPER 2>/dev/null; pkill -f "$A/work.py" 2>/dev/null; rm -rf "$IMG"' EXIT
for _ in $(seq 100); do "$GPUCR" status --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done

hbs() { grep -c '^hb' "$1" 2>/dev/null || echo 0; }
note ""
note "## gpucr: gpucr checkpoint / gpucr restore (CRIU with gpucr_plugin.so)"
note "| GB | dump total | image | restore (criu) | restore to next heartbeat | checksum advancing after |"
note "|---|---|---|---|---|---|"
for gb in $SIZES; do
	L=$(cd "$LOGS" && pwd)/work-$gb.log
	rm -f "$L" && rm -rf "$IMG"
	setsid "$GPUCR" run --socket "$SOCK" -- $PY "$A/work.py" "$gb" "$L" </dev/null >"$LOGS/work-$gb.out" 2>&1 &
	for _ in $(seq 900); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
	P=$(grep -o 'pid=[0-9]*' "$L" | head -1 | cut -d= -f2)
	if [ -z "$P" ]; then
		bad "$gb GB: the workload did not start: $(tail -3 "$LOGS/work-$gb.out")"
		continue
	fi
	sleep 1
	t0=$(now)
	"$GPUCR" checkpoint "$P" -D "$IMG" --plugin-dir "$PLUGINS" --socket "$SOCK" >"$LOGS/ckpt-$gb.txt" 2>&1 || bad "$gb GB: checkpoint: $(tail -2 "$LOGS/ckpt-$gb.txt")"
	t1=$(now)
	size=$(du -sb "$IMG" | cut -f1)
	n0=$(hbs "$L")
	sleep 0.5
	t2=$(now)
	"$GPUCR" restore -D "$IMG" --plugin-dir "$PLUGINS" --socket "$SOCK" >"$LOGS/restore-$gb.txt" 2>&1 || bad "$gb GB: restore: $(tail -2 "$LOGS/restore-$gb.txt")"
	t3=$(now)
	t4=""
	for _ in $(seq 3000); do
		if [ "$(hbs "$L")" -gt "$n0" ]; then t4=$(now); break; fi
		sleep 0.01
	done
	adv=no
	if [ -n "$t4" ]; then
		c1=$(grep '^hb' "$L" | tail -1 | awk '{print $4}')
		sleep 1
		c2=$(grep '^hb' "$L" | tail -1 | awk '{print $4}')
		[ "$c1" != "$c2" ] && adv=yes
	fi
	[ $adv = yes ] || bad "$gb GB: no advancing heartbeat after the restore"
	note "| $gb | $(python3 -c "print(f'{$t1-$t0:.3f} s')") | $((size / 1000000)) MB | $(python3 -c "print(f'{$t3-$t2:.3f} s')") | $([ -n "$t4" ] && python3 -c "print(f'{$t4-$t2:.3f} s')" || echo never) | $adv |"
	cp "$IMG/dump.log" "$LOGS/dump-$gb.log" 2>/dev/null
	cp "$IMG/restore.log" "$LOGS/restore-$gb.log" 2>/dev/null
	pkill -f "$A/work.py" 2>/dev/null
	sleep 1
done
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/criu-summary.txt" && tar -czf "$OUT/criu-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
exit $fail
