#!/usr/bin/env bash
# Memory shared as NCCL shares it, on the real driver, plain and under gpucr:
#   drvtest's share_* cases (host-NUMA cuMem, re-export of an import, peer
#   access, stream memory operations, cuGetProcAddress identity), plain and
#   under `gpucr run`;
#   peerapp (two ranks on two GPUs exchanging handles, fds, peer mappings and
#   stream-memop flags), plain and under `gpucr run`: the same checksums.
#
#   bash tests/gpu/share-check.sh GPUCR_PREFIX
#
# Builds the test programs (make gpu-apps). Logs in build/gpu/share (and
# $OUT/share-logs.tgz); summary.txt holds the table.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: share-check.sh GPUCR_PREFIX" "$@"
fresh_logs build/gpu/share
BIN=build/gpu/bin
SOCK=/run/gpucr/share-helper.sock
HELPER=
finish() {
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null
	[ -n "${OUT:-}" ] && tar -czf "$OUT/share-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
}
trap finish EXIT
note "## memory shared as NCCL shares it"
note_host
make -s gpu-apps >"$LOGS/make.txt" 2>&1 || bad "make gpu-apps: $(tail -3 "$LOGS/make.txt")"
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info || bad "the helper did not answer"

CASES=$("$BIN/drvtest" -l | grep '^share_' | xargs)
for mode in plain gpucr; do
	pre=()
	[ $mode = gpucr ] && pre=("$GPUCR" run --socket "$SOCK" --)
	timeout 120 "${pre[@]}" "$BIN/drvtest" $CASES >"$LOGS/drvtest.$mode" 2>&1
	note "drvtest share cases, $mode: exit $?, $(grep -c '^ok' "$LOGS/drvtest.$mode") ok, $(grep -c '^FAIL' "$LOGS/drvtest.$mode") failed $(grep '^FAIL' "$LOGS/drvtest.$mode" | head -3 | tr '\n' ' ')"
	grep -q '^FAIL' "$LOGS/drvtest.$mode" && fail=1
done

hb() { awk '$1 == "hb" || $1 == "done" {print $1, $2, $3}' "$1"; }
ARGS=(--iters 400 --hb-every 50 --interval-ms 0 --mib 64)
t0=$(now)
timeout 120 "$BIN/peerapp" "${ARGS[@]}" >"$LOGS/peerapp.plain" 2>&1
rc=$?
t1=$(now)
timeout 120 "$GPUCR" run --socket "$SOCK" -- "$BIN/peerapp" "${ARGS[@]}" >"$LOGS/peerapp.gpucr" 2>&1
rc2=$?
t2=$(now)
note "peerapp plain: exit $rc, $(span "$t0" "$t1"); under gpucr: exit $rc2, $(span "$t1" "$t2")"
if [ $rc = 0 ] && [ $rc2 = 0 ] && [ "$(hb "$LOGS/peerapp.plain")" = "$(hb "$LOGS/peerapp.gpucr")" ] && [ -n "$(hb "$LOGS/peerapp.plain")" ]; then
	note "peerapp: checksums identical ($(hb "$LOGS/peerapp.gpucr" | wc -l) lines; last: $(hb "$LOGS/peerapp.gpucr" | tail -1))"
else
	bad "peerapp: $(tail -3 "$LOGS/peerapp.gpucr" | tr '\n' ' ')"
fi
note "gpucr warnings under gpucr: $(grep -h '^gpucr:' "$LOGS/peerapp.gpucr" "$LOGS/drvtest.gpucr" | cut -c1-140 | sort | uniq -c | sort -rn | head -4 | tr '\n' ';')"
exit $fail
