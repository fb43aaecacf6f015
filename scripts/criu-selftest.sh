#!/usr/bin/env bash
# criu-selftest.sh: judge a CRIU by a real dump and restore, under a time limit.
#
# usage: scripts/criu-selftest.sh [-q] [-t SECONDS] CRIU
#   CRIU        the criu binary or launcher to test
#   -t SECONDS  limit for each of dump and restore (default 60)
#   -q          print only failures
#
# `criu check` is not enough: Debian 13's CRIU 4.1.1 says "Looks good" on
# Linux 6.18 and then hangs in every dump (after the parasite's cure), and
# Debian 12's 3.17 cannot even parse that kernel's [vvar_vclock]. This test
# starts a shell loop in its own session that appends a counter to a file,
# dumps it (the dump kills it), checks that the counter stopped, restores it
# detached, and checks that the counter goes on. Exit status 0: CRIU works.
# Needs root. Leaves nothing behind (the restored loop is killed).
set -euo pipefail

limit=60
quiet=0
while getopts qt: o; do
	case $o in
	q) quiet=1 ;;
	t) limit=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { echo "usage: $0 [-q] [-t SECONDS] CRIU" >&2; exit 2; }
criu=$1

say() { [ "$quiet" = 1 ] || printf '[criu-selftest] %s\n' "$*"; }
fail() { printf '[criu-selftest] FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root"
[ -x "$criu" ] || command -v "$criu" >/dev/null || fail "$criu not found"

tdir=$(mktemp -d /tmp/gpucr-criu-selftest.XXXXXX)
pid=
cleanup() {
	if [ -n "$pid" ]; then kill -9 -- "-$pid" "$pid" 2>/dev/null || true; fi
	rm -rf "$tdir"
}
trap cleanup EXIT

# A process of its own session, child of pid 1 (the subshell exits at once):
# CRIU dumps it without --shell-job. The subshell first closes every fd it
# inherited above stderr (a caller's lock file, say: CRIU refuses to dump a
# held file lock without --file-locks).
count=$tdir/count
# shellcheck disable=SC2016 # expanded by the inner sh
(for fd in /proc/self/fd/*; do
	fd=${fd##*/}
	[ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
done
setsid sh -c 'echo $$ > "$1"; i=0; while :; do i=$((i+1)); echo $i >> "$2"; sleep 0.1; done' \
	loop "$tdir/pid" "$count" </dev/null >/dev/null 2>&1 &)
for _ in $(seq 50); do [ -s "$count" ] && [ "$(tail -n1 "$count")" -ge 3 ] && break; sleep 0.1; done
pid=$(cat "$tdir/pid" 2>/dev/null || true)
[ -n "$pid" ] && [ "$(tail -n1 "$count" 2>/dev/null || echo 0)" -ge 3 ] || fail "the test loop does not run"

mkdir "$tdir/img"
say "dumping a shell loop (pid $pid) with $criu (limit ${limit}s)"
rc=0
timeout -k 5 "$limit" "$criu" dump -t "$pid" -D "$tdir/img" -o dump.log -v4 || rc=$?
if [ "$rc" -ne 0 ]; then
	tail -n 15 "$tdir/img/dump.log" >&2 || true
	[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && fail "criu dump did not finish within ${limit}s (this CRIU hangs on this kernel: $(uname -r))"
	fail "criu dump failed (exit $rc)"
fi
# Until pid 1 has reaped the killed loop and its sleep, the pid is still
# taken (as their session id) and restore fails with "File exists".
for _ in $(seq 100); do pgrep -s "$pid" >/dev/null || break; sleep 0.05; done
! pgrep -s "$pid" >/dev/null || fail "processes of session $pid are still there after the dump"
at_dump=$(tail -n1 "$count")
sleep 0.3
[ "$(tail -n1 "$count")" = "$at_dump" ] || fail "the counter moved after the dump"

say "restoring"
rc=0
timeout -k 5 "$limit" "$criu" restore -d -D "$tdir/img" -o restore.log -v4 || rc=$?
if [ "$rc" -ne 0 ]; then
	tail -n 15 "$tdir/img/restore.log" >&2 || true
	[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && fail "criu restore did not finish within ${limit}s"
	fail "criu restore failed (exit $rc)"
fi
for _ in $(seq 50); do [ "$(tail -n1 "$count")" -gt "$at_dump" ] && break; sleep 0.1; done
now=$(tail -n1 "$count")
[ "$now" -gt "$at_dump" ] || fail "the counter did not go on after the restore ($at_dump -> $now)"
kill -0 "$pid" 2>/dev/null || fail "the restored process $pid is not there"
say "ok: dumped at $at_dump, restored, counter at $now"
