#!/usr/bin/env bash
# gpucr migrate on the GPU machine, both ends on this one machine:
#
#   bash tests/gpu/migrate.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB]
#
# The target "machine" is a pid and mount namespace with a gpucr helper of
# its own, whose socket directory is bound over the source helper's (a
# restored process reconnects to the socket path it had, as on two machines
# that both use /run/gpucr/helper.sock). `--ssh` is a stand-in that runs the
# command line inside those namespaces with nsenter (this machine has no
# sshd); everything else is gpucr migrate as users run it. In one call:
#
#  1. baseline: work.py holding GB (default 8) of GPU memory, `gpucr
#     checkpoint` then `gpucr restore` on this machine: the downtime of a
#     stop-the-world move without a second machine;
#  2. `gpucr migrate --shared` (the target reads the same image directory)
#     and `gpucr migrate` streaming the image (tar through the stand-in to
#     the target's `gpucr image receive`):
#     the downtime gpucr reports, and the time from the start to the first
#     heartbeat at the target;
#  3. a training script with DataLoader workers (matrix_workloads.py
#     train_dataloader) migrated mid-run: every line it prints equals a
#     plain run's;
#  4. a migration whose restore fails at the target: the source is continued
#     and gets its GPU back (checksum advancing).
# Images in /dev/shm. Logs in build/gpu/migrate (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: migrate.sh GPUCR_PREFIX CRIU_BUNDLE ANCHOR_DIR [GB]"
prefix_criu_args "$usage" "$@"
A=${3:?$usage}
A=$(cd "$A" && pwd)
GB=${4:-8}
PY=${PYTHON:-python3}
fresh_logs build/gpu/migrate
use_criu "$C" || exit 1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
DEADLINE=${DEADLINE:-400}
T_START=$(date +%s)
left() { echo $((T_START + DEADLINE - $(date +%s))); }
IMG=/dev/shm/gpucr-migrate
SRC=/run/gpucr-mig-src
DST=/run/gpucr-mig-dst
SOCK=$SRC/helper.sock
rm -rf "$IMG" "$SRC" "$DST" && mkdir -p "$IMG" "$SRC" "$DST"
UNSHARE=
cleanup() {
	pkill -9 -f "$A/work.py" 2>/dev/null
	pkill -9 -f matrix_workloads.py 2>/dev/null
	[ -n "$UNSHARE" ] && kill -9 "$UNSHARE" 2>/dev/null
	kill "$HELPER" 2>/dev/null
	rm -rf "$IMG"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

note_host
start_helper "$GPUCR" "$SOCK" "$LOGS/source-helper.log" --log-level info || { bad "the source helper does not start"; exit 1; }
# The target: its init (a python loop that reaps every child) starts the
# target's helper on the same socket path, inside its namespaces (a network
# namespace too: abstract unix socket names, which DataLoader workers use,
# are per network namespace, as they are per machine).
unshare --pid --fork --kill-child --mount --mount-proc --net $PY -c "
import os, subprocess, sys, time
subprocess.check_call(['mount', '--bind', '$DST', '$SRC'])
# lo up (CRIU probes TCP repair on it), by SIOCGIFFLAGS/SIOCSIFFLAGS: no ip(8) here
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack('16sH', fcntl.ioctl(s, 0x8913, struct.pack('16sH', b'lo', 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack('16sH', b'lo', flags | 1))
subprocess.Popen(['$GPUCR', 'helper', '--socket', '$SOCK', '--log-level', 'info'], stdout=open('$LOGS/target-helper.log', 'a'), stderr=subprocess.STDOUT)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
" &
UNSHARE=$!
TPID=
for _ in $(seq 100); do
	TPID=$(pgrep -P "$UNSHARE" | head -1)
	# the target's own helper (its log says it listens), not the source's
	[ -n "$TPID" ] && grep -q "helper listening" "$LOGS/target-helper.log" 2>/dev/null &&
		nsenter -t "$TPID" -p -m -- "$GPUCR" status --socket "$SOCK" >/dev/null 2>&1 && break
	sleep 0.1
done
grep -q "helper listening" "$LOGS/target-helper.log" 2>/dev/null &&
	nsenter -t "$TPID" -p -m -- "$GPUCR" status --socket "$SOCK" >"$LOGS/target-status.txt" 2>&1 || { bad "the target helper does not answer"; exit 1; }
NSSSH=$LOGS/nsssh
printf '#!/bin/sh\nshift\nexec nsenter -t %s -p -m -n -- /bin/sh -c "$1"\n' "$TPID" >"$NSSSH"
chmod 755 "$NSSSH"
TGPUCR="env GPUCR_SOCKET=$SOCK GPUCR_CRIU=$GPUCR_CRIU $GPUCR"

# jf FILE KEY...: a value from the last line of FILE (a --json document).

# start_work NAME: work.py of GB under gpucr run; its pid in P, its log in L.
start_work() {
	L=$LOGS/work-$1.log
	rm -f "$L"
	setsid "$GPUCR" run --socket "$SOCK" -- $PY "$A/work.py" "$GB" "$L" </dev/null >"$LOGS/work-$1.out" 2>&1 &
	for _ in $(seq 900); do grep -q '^ready' "$L" 2>/dev/null && break; sleep 0.1; done
	P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
	[ -n "$P" ] || { bad "$1: work.py did not start: $(tail -3 "$LOGS/work-$1.out")"; return 1; }
	sleep 1
}

note ""
note "## moving work.py holding $GB GB (the heartbeat every 20 steps)"
note "| how | downtime (reported) | dump | transfer | restore | start to next heartbeat | checksum advancing after |"
note "|---|---|---|---|---|---|---|"
if start_work base; then
	n0=$(hbs "$L")
	t0=$(now)
	"$GPUCR" checkpoint "$P" -D "$IMG/base" --socket "$SOCK" --json >"$LOGS/base-ckpt.json" 2>&1 || bad "baseline checkpoint: $(tail -2 "$LOGS/base-ckpt.json")"
	t1=$(now)
	"$GPUCR" restore -D "$IMG/base" --socket "$SOCK" --json >"$LOGS/base-restore.json" 2>&1 || bad "baseline restore: $(tail -2 "$LOGS/base-restore.json")"
	t2=$(now)
	t3=$(next_heartbeat "$L" "$n0")
	adv=no
	[ -n "$t3" ] && adv=$(checksum_advancing "$L")
	note "| checkpoint + restore, this machine | $(span "$t0" "$t2") | $(span "$t0" "$t1") | - | $(span "$t1" "$t2") | $([ -n "$t3" ] && span "$t0" "$t3" || echo never) | $adv |"
	pkill -9 -f "$A/work.py"
	sleep 1
	rm -rf "$IMG/base"
fi
for how in shared stream; do
	[ "$(left)" -gt 60 ] || { bad "$how: out of time"; continue; }
	start_work "$how" || continue
	args=(-D "$IMG/$how-src" --target-dir "$IMG/$how-dst")
	[ $how = shared ] && args=(-D "$IMG/$how" --shared)
	n0=$(hbs "$L")
	t0=$(now)
	timeout 120 "$GPUCR" migrate "$P" --to target --ssh "$NSSSH" --target-gpucr "$TGPUCR" --socket "$SOCK" "${args[@]}" --json >"$LOGS/$how.json" 2>"$LOGS/$how.err" ||
		bad "$how: gpucr migrate: $(tail -n 3 "$LOGS/$how.json"; tail -n 3 "$LOGS/$how.err")"
	t3=$(next_heartbeat "$L" "$n0")
	adv=no
	[ -n "$t3" ] && adv=$(checksum_advancing "$L")
	[ "$adv" = yes ] || bad "$how: no advancing heartbeat after the migration"
	kill -0 "$P" 2>/dev/null && [ "$(ps -o stat= -p "$P")" != Z ] && bad "$how: the source (pid $P) still runs"
	f() { v=$(jf "$LOGS/$how.json" "$1"); printf '%.3f s' "${v:-0}"; }
	mb=$(jf "$LOGS/$how.json" transfer_bytes)
	note "| gpucr migrate $([ $how = shared ] && echo --shared || echo '(streamed)') | $(f downtime_seconds) | $(f dump_seconds) | $(f transfer_seconds) ($((${mb:-0} / 1000000)) MB) | $(f restore_seconds) | $([ -n "$t3" ] && span "$t0" "$t3" || echo never) | $adv |"
	pkill -9 -f "$A/work.py"
	sleep 1
	rm -rf "$IMG/$how" "$IMG/$how-src" "$IMG/$how-dst"
done

note ""
note "## a training script with DataLoader workers, migrated mid-run"
W=$PWD/tests/gpu/matrix_workloads.py
STEPS=${STEPS:-400}
if [ "$(left)" -gt 90 ]; then
	rm -f "$LOGS"/train-*.txt
	$PY "$W" train_dataloader "$LOGS/train-plain.txt" "$STEPS" >"$LOGS/train-plain.out" 2>&1 &
	PLAIN=$!
	MATRIX_DELAY=0.04 setsid "$GPUCR" run --socket "$SOCK" -- $PY "$W" train_dataloader "$LOGS/train-migrated.txt" "$STEPS" </dev/null >"$LOGS/train-migrated.out" 2>&1 &
	for _ in $(seq 900); do [ "$(grep -c '^step' "$LOGS/train-migrated.txt" 2>/dev/null)" -gt 50 ] 2>/dev/null && break; sleep 0.1; done
	TP=$(grep -o 'pid=[0-9]*' "$LOGS/train-migrated.txt" | head -1 | cut -d= -f2)
	migrated=yes
	timeout 120 "$GPUCR" migrate "$TP" --to target --ssh "$NSSSH" --target-gpucr "$TGPUCR" --socket "$SOCK" -D "$IMG/train-src" --target-dir "$IMG/train-dst" >"$LOGS/train-migrate.txt" 2>&1 ||
		{ migrated=no; bad "train: gpucr migrate: $(tail -n 5 "$LOGS/train-migrate.txt")"; }
	# until it is done, or no process of it is left (bounded by the deadline)
	for _ in $(seq $(($(left) * 10))); do
		grep -q '^done' "$LOGS/train-migrated.txt" 2>/dev/null && break
		pgrep -f "train_dataloader $LOGS/train-migrated.txt" >/dev/null || break
		sleep 0.1
	done
	wait $PLAIN
	if grep -q '^done' "$LOGS/train-migrated.txt" && diff <(grep -v '^ready' "$LOGS/train-plain.txt") <(grep -v '^ready' "$LOGS/train-migrated.txt") >"$LOGS/train-diff.txt"; then
		note "train_dataloader, $STEPS steps, migrated ($migrated) at step $(grep '^step' "$LOGS/train-migrated.txt" | head -60 | tail -1 | cut -d' ' -f2)ish: every line equals the plain run's ($(tail -1 "$LOGS/train-migrate.txt"))"
	else
		bad "train_dataloader: the migrated run differs from the plain run or did not finish (see train-diff.txt): $(tail -n 2 "$LOGS/train-migrated.txt"); its stderr: $(tail -n 8 "$LOGS/train-migrated.out")"
	fi
else
	bad "train: out of time"
fi

note ""
note "## a migration whose restore fails at the target"
FAILG=$LOGS/failing-gpucr
# it answers version, receives and discards the image (gpucr image), and
# fails every restore
printf '#!/bin/sh\ncase "$1" in version|image) exec %s "$@";; esac\necho "{\\"error\\": \\"restore refused on purpose\\"}"\nexit 1\n' "$GPUCR" >"$FAILG"
chmod 755 "$FAILG"
if [ "$(left)" -gt 40 ] && GB=2 start_work fail; then
	n0=$(hbs "$L")
	t0=$(now)
	timeout 120 "$GPUCR" migrate "$P" --to target --ssh "$NSSSH" --target-gpucr "$FAILG" --socket "$SOCK" -D "$IMG/fail-src" --target-dir "$IMG/fail-dst" >"$LOGS/fail.txt" 2>&1
	rc=$?
	t1=$(now)
	t3=$(next_heartbeat "$L" "$(hbs "$L")")
	adv=no
	[ -n "$t3" ] && adv=$(checksum_advancing "$L")
	if [ $rc = 1 ] && grep -q "the source (pid $P) runs on" "$LOGS/fail.txt" && [ "$adv" = yes ]; then
		note "exit 1 after $(span "$t0" "$t1"); the source ran on with its GPU, next heartbeat $(span "$t1" "$t3") after the command: $(grep -c . "$LOGS/fail.txt") lines, ending: $(tail -1 "$LOGS/fail.txt")"
	else
		bad "failed migration: exit $rc, checksum advancing $adv: $(tail -n 6 "$LOGS/fail.txt")"
	fi
fi
[ -n "${OUT:-}" ] && cp -r "$LOGS" "$OUT/" 2>/dev/null
exit $fail
