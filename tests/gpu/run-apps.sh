#!/usr/bin/env bash
# The test applications on a real GPU, against the simulator's checksums.
#
#   bash tests/gpu/run-apps.sh             on the GPU machine (driver + /usr/local/cuda)
#   bash tests/gpu/run-apps.sh --sim       on the simulator: compare with the stored checksums
#   bash tests/gpu/run-apps.sh --generate  on the simulator: rewrite the stored checksums
#
# On the GPU machine, in order:
#   1. build: `make -k gpu-apps` (the apps and drvtest linked with the real driver)
#   2. ABI: tests/gpu/abi-check.py (cudadrv.h against cuda.h and libcuda.so.1)
#   3. checksums: each application with fixed parameters, --iters and
#      --interval-ms 0; its final checksum against the simulator's, stored in
#      tests/gpu/expected-checksums.txt (a table: app, params, iterations,
#      GPU, simulator, equal)
#   4. driver checkpoint: each application runs, cudackpt locks and
#      checkpoints it, it must not advance, cudackpt restores and unlocks it,
#      and every heartbeat must equal an uninterrupted run's
#   5. drvtest (the simulator's conformance test) against the real driver
# Logs go to build/gpu/logs; where $OUT is set, a summary and a tarball of
# the logs go there too. Exit status 0 only if every step passed.
set -u
cd "$(dirname "$0")/../.."
# For NVLink multicast off; the summary below is this script's own (say,
# fail), in build/gpu/logs whatever LOGS says.
. tests/gpu/lib.sh
ROOT=$(pwd)
EXPECTED=tests/gpu/expected-checksums.txt
MODE=gpu
case "${1:-}" in
--sim) MODE=sim ;;
--generate) MODE=generate ;;
"") ;;
*)
	echo "usage: $0 [--sim | --generate]" >&2
	exit 2
	;;
esac

# The checksum cases: NAME ITERS ARGS... Iterations 0 (the init kernel only)
# and 1 (one step) localize a difference; the longer runs cover all paths.
CASES=(
	"heartbeat 0 --mib 24 --buffers 7"
	"heartbeat 1 --mib 24 --buffers 7"
	"heartbeat 30 --mib 24 --buffers 7"
	"heartbeat 20 --mib 64 --buffers 8"
	"heartbeat 50 --mib 3 --buffers 2 --seed 7"
	"heartbeat 30 --mib 24 --buffers 7 --graph"
	"heartbeat 20 --mib 8 --buffers 4 --still-mib 16"
	"ptrchase 0 --mib 8"
	"ptrchase 1 --mib 8"
	"ptrchase 30 --mib 8"
	"ptrchase 25 --mib 16 --buffers 9 --seed 3"
	"ptrchase 20 --mib 8 --still-mib 16"
	"vmmapp 0 --mib 8"
	"vmmapp 1 --mib 8"
	"vmmapp 30 --mib 8"
	"vmmapp 20 --mib 64"
	"vmmapp 10 --mib 1 --seed 5"
)

if [ "$MODE" = gpu ]; then
	BIN=build/gpu/bin
	LOGS=build/gpu/logs
	RUNENV=()
else
	BIN=build/bin
	LOGS=build/sim-logs
	RUNENV=(env "LD_LIBRARY_PATH=$ROOT/build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
FAILS=0
fail() {
	say "FAIL: $*"
	FAILS=$((FAILS + 1))
}

finish() {
	say ""
	if [ "$FAILS" -eq 0 ]; then say "run-apps: PASSED ($MODE)"; else say "run-apps: FAILED ($FAILS failure(s), $MODE)"; fi
	if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
		cp "$SUMMARY" "$OUT/summary.txt"
		tar -czf "$OUT/run-apps-logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
	fi
	[ "$FAILS" -eq 0 ]
	exit $?
}

# --- 1. build -------------------------------------------------------------
say "== build ($MODE)"
if [ "$MODE" = gpu ]; then
	{
		nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
		ls -l /usr/local/cuda/lib64/stubs/libcuda.so 2>&1
		ldconfig -p | grep 'libcuda.so.1' 2>&1
	} | tee -a "$SUMMARY"
	make -k gpu-apps >"$LOGS/build.log" 2>&1
else
	make -k build/sim/libcuda.so.1 build/bin/heartbeat build/bin/ptrchase build/bin/vmmapp \
		build/bin/cudackpt >"$LOGS/build.log" 2>&1
fi
for app in heartbeat ptrchase vmmapp cudackpt; do
	[ -x "$BIN/$app" ] || fail "build: $BIN/$app missing (see $LOGS/build.log)"
done
grep -E 'error|Error' "$LOGS/build.log" | head -20 | tee -a "$SUMMARY"

# --- 2. ABI ---------------------------------------------------------------
if [ "$MODE" = gpu ]; then
	say ""
	say "== ABI: cudadrv.h against cuda.h and libcuda.so.1"
	python3 tests/gpu/abi-check.py --workdir "$LOGS/abi" >"$LOGS/abi-check.log" 2>&1
	rc=$?
	grep -E '^(abi-check|ABI FAIL)' "$LOGS/abi-check.log" | tee -a "$SUMMARY"
	[ $rc -eq 0 ] || fail "abi-check (see $LOGS/abi-check.log)"
fi

# --- 3. checksums ---------------------------------------------------------
# The stored checksum of a case: the line "NAME ITERS CHECKSUM ARGS...".
expected_of() {
	local name=$1 iters=$2
	shift 2
	awk -v n="$name" -v i="$iters" -v a="$*" '
		/^#/ || NF < 3 { next }
		{ args = ""; for (k = 4; k <= NF; k++) args = args (k > 4 ? " " : "") $k }
		$1 == n && $2 == i && args == a { print $3; exit }' "$EXPECTED"
}

say ""
say "== checksums ($MODE)"
if [ "$MODE" = generate ]; then
	NEW=$(mktemp)
	{
		echo "# Final checksums of the test applications on gpucr's simulated driver, run as"
		echo "#   NAME ARGS --iters ITERS --interval-ms 0"
		echo "# written by 'bash tests/gpu/run-apps.sh --generate'; run-apps.sh compares a real"
		echo "# GPU's checksums with these, and --sim (CI) the simulator's."
		echo "# NAME ITERS CHECKSUM ARGS..."
	} >"$NEW"
fi
other=$([ "$MODE" = gpu ] && echo GPU || echo simulator)
printf '%-10s %-32s %6s  %-16s  %-16s  %s\n' app params iters "$other" "stored (sim)" equal | tee -a "$SUMMARY"
n=0
for c in "${CASES[@]}"; do
	set -- $c
	name=$1 iters=$2
	shift 2
	args="$*"
	n=$((n + 1))
	log=$LOGS/sum-$n-$name.log
	timeout 600 "${RUNENV[@]}" "$BIN/$name" $args --iters "$iters" --interval-ms 0 >"$log" 2>&1
	rc=$?
	got=$(awk '$1 == "done" { print $3 }' "$log")
	[ $rc -eq 0 ] && [ -n "$got" ] || got="exit-$rc"
	if [ "$MODE" = generate ]; then
		echo "$name $iters $got $args" >>"$NEW"
		want=$got
	else
		want=$(expected_of "$name" "$iters" "$args")
		[ -n "$want" ] || want="none"
	fi
	eq=no
	[ "$got" = "$want" ] && [ "${got#exit-}" = "$got" ] && eq=yes
	printf '%-10s %-32s %6s  %-16s  %-16s  %s\n' "$name" "$args" "$iters" "$got" "$want" "$eq" | tee -a "$SUMMARY"
	if [ $eq = no ]; then
		fail "$name $args --iters $iters: $got, expected $want (log $log)"
		tail -5 "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
	fi
done
if [ "$MODE" = generate ]; then
	mv "$NEW" "$EXPECTED"
	say "wrote $EXPECTED"
fi

# --- 4. driver checkpoint of a running application ------------------------
# Returns the last heartbeat iteration in a log (0 if none).
last_hb() { awk '$1 == "hb" { it = $2 } END { print it + 0 }' "$1"; }
wait_hb() { # LOG ITER SECONDS
	local t=0
	while [ "$(last_hb "$1")" -lt "$2" ]; do
		sleep 0.1
		t=$((t + 1))
		[ $t -lt $(($3 * 10)) ] || return 1
	done
}

ckpt_case() { # NAME ARGS...
	local name=$1
	shift
	local log=$LOGS/ckpt-$name.log clog=$LOGS/ckpt-$name-cudackpt.log pid before after st ref
	"${RUNENV[@]}" "$BIN/$name" "$@" --hb-every 5 --interval-ms 10 >"$log" 2>&1 &
	pid=$!
	ckpt() { "${RUNENV[@]}" timeout 120 "$BIN/cudackpt" "$@" "$pid" >>"$clog" 2>&1; }
	state() { "${RUNENV[@]}" "$BIN/cudackpt" state "$pid" 2>>"$clog" | tee -a "$clog" |
		sed -n 's/.*state=\([a-z]*\).*/\1/p'; }
	local ok=1
	if ! wait_hb "$log" 10 120; then
		fail "ckpt $name: no heartbeat 10 (log $log)"
		ok=0
	fi
	[ $ok = 1 ] && { ckpt state tid || { fail "ckpt $name: state/tid"; ok=0; }; }
	[ $ok = 1 ] && { ckpt lock checkpoint || { fail "ckpt $name: lock checkpoint"; ok=0; }; }
	if [ $ok = 1 ]; then
		st=$(state)
		[ "$st" = checkpointed ] || { fail "ckpt $name: state after checkpoint: '$st'"; ok=0; }
		before=$(last_hb "$log")
		sleep 1
		after=$(last_hb "$log")
		[ "$before" = "$after" ] || { fail "ckpt $name: advanced from $before to $after while checkpointed"; ok=0; }
		ckpt restore unlock || { fail "ckpt $name: restore unlock"; ok=0; }
		st=$(state)
		[ "$st" = running ] || { fail "ckpt $name: state after restore: '$st'"; ok=0; }
		wait_hb "$log" $((before + 20)) 120 || { fail "ckpt $name: no progress after restore"; ok=0; }
	fi
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	if [ $ok = 1 ]; then
		after=$(last_hb "$log")
		ref=$LOGS/ckpt-$name-reference.log
		"${RUNENV[@]}" "$BIN/$name" "$@" --hb-every 5 --interval-ms 0 --iters "$after" >"$ref" 2>&1
		local diffs
		diffs=$(join <(awk '$1 == "hb" { print $2, $3 }' "$log" | sort) \
			<(awk '$1 == "hb" { print $2, $3 }' "$ref" | sort) | awk '$2 != $3' | wc -l)
		local nhb
		nhb=$(awk '$1 == "hb"' "$log" | wc -l)
		if [ "$diffs" -ne 0 ] || [ "$nhb" -lt 4 ]; then
			fail "ckpt $name: $diffs of $nhb heartbeats differ from the uninterrupted run"
			ok=0
		fi
	fi
	sed 's/^/    /' "$clog" | tee -a "$SUMMARY"
	if [ $ok = 1 ]; then
		say "ckpt $name: OK (checkpointed at iteration $before, heartbeats up to $after equal an uninterrupted run's)"
	fi
}

if [ "$MODE" != generate ]; then
	say ""
	say "== driver checkpoint with cudackpt ($MODE)"
	ckpt_case heartbeat --mib 64 --buffers 8
	ckpt_case ptrchase --mib 16
	ckpt_case vmmapp --mib 64
fi

# --- 5. drvtest -----------------------------------------------------------
if [ "$MODE" = gpu ]; then
	say ""
	say "== drvtest against the real driver"
	if [ -x build/gpu/bin/drvtest ]; then
		timeout 600 build/gpu/bin/drvtest >"$LOGS/drvtest.log" 2>&1
		rc=$?
		tail -40 "$LOGS/drvtest.log" | tee -a "$SUMMARY"
		say "drvtest: exit $rc"
		[ $rc -eq 0 ] || fail "drvtest exit $rc (log $LOGS/drvtest.log)"
	else
		fail "drvtest: build/gpu/bin/drvtest was not built (see $LOGS/build.log)"
	fi
fi

finish
