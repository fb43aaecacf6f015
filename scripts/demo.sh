#!/usr/bin/env bash
# The main job, shown end to end (`make demo` runs this after installing and
# building): the gpucr helper starts; a GPU application runs under `gpucr
# run` (its GPU memory is helper-owned); `gpucr checkpoint` dumps it through
# CRIU with gpucr's plugin (the GPU data goes through the helper into the
# image, only the residual context through the driver's checkpoint API; the
# process ends); `gpucr restore` brings it back, and it carries on from where
# it was with exactly the checksums of an uninterrupted run. Without a GPU it
# runs on gpucr's simulated driver.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/sbin:/usr/local/bin:$PATH"
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
APP_ARGS=(--mib 64 --buffers 8 --hb-every 5 --interval-ms 20)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
	echo "GPU found: $(nvidia-smi -L | head -1)"
	make -s gpu-apps BUILD="$BUILD"
	BIN=$BUILD/gpu/bin
	unset LD_LIBRARY_PATH
else
	echo "No GPU here: running on gpucr's simulated CUDA driver ($BUILD/sim/libcuda.so.1)."
	BIN=$BUILD/bin
	export LD_LIBRARY_PATH=$BUILD/sim
fi

work=$(mktemp -d /tmp/gpucr-demo.XXXXXX)
log=$work/app.log
img=$work/img
sock=$work/helper.sock
GPUCR=$BUILD/bin/gpucr
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
	export GPUCR_LIBCUDA=$BUILD/sim/libcuda.so.1 # helper and interposer: the simulated driver
fi
pid=
helper=
# cleanup ends the application and the helper, then removes the work
# directory. The helper first, and waited for: until it exits it touches
# helper.alive beside its socket every second, making the file again if it
# is gone, and an rm -rf of the directory that spans such a tick fails
# ("Directory not empty"). What is left to remove is no failure of the demo:
# it keeps the exit status the demo had.
cleanup() {
	local rc=$?
	if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
	if [ -n "$helper" ]; then
		kill "$helper" 2>/dev/null || true
		wait "$helper" 2>/dev/null || true
	fi
	if ! rm -rf "$work" 2>/dev/null && ! rm -rf "$work"; then
		echo "demo: warning: could not remove $work; remove it by hand" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT

last_hb() { awk '$1=="hb"{l=$0} END{print l}' "$log"; }
wait_iter() { # wait until the app reports iteration >= $1
	for _ in $(seq 1 600); do
		it=$(last_hb | awk '{print $2}')
		[ -n "$it" ] && [ "$it" -ge "$1" ] && return 0
		sleep 0.1
	done
	echo "the application did not reach iteration $1"; tail "$log"; exit 1
}

echo; echo "1. start the helper (gpucr helper) and the application under gpucr run"
"$GPUCR" helper --socket "$sock" --log-level warn >"$work/helper.log" 2>&1 &
helper=$!
for _ in $(seq 1 100); do "$GPUCR" status --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
setsid "$GPUCR" run --socket "$sock" -- "$BIN/heartbeat" "${APP_ARGS[@]}" </dev/null >>"$log" 2>&1 &
pid=$!
disown "$pid" # no "Killed" job notice when the dump ends it
wait_iter 20
echo "   $(head -1 "$log")"
echo "   $(last_hb)"
"$GPUCR" status --socket "$sock" | sed 's/^/   /'

echo; echo "2. gpucr checkpoint $pid -D $img  (CRIU + gpucr's plugin; the process exits)"
"$GPUCR" checkpoint "$pid" -D "$img" --socket "$sock" | sed 's/^/   /'
before=$(last_hb)
kill -0 "$pid" 2>/dev/null && { echo "process still alive after the checkpoint returned"; exit 1; }
echo "   process $pid is gone; last heartbeat: $before"
"$GPUCR" image inspect "$img" | sed -n '1,4p' | sed 's/^/   /'

echo; echo "3. gpucr restore -D $img"
"$GPUCR" restore -D "$img" --socket "$sock" | sed 's/^/   /'
it=$(echo "$before" | awk '{print $2}')
wait_iter $((it + 20))
echo "   $(last_hb)"
kill -9 "$pid"; pid=

echo; echo "4. compare with an uninterrupted run of the same application"
last=$(last_hb | awk '{print $2}')
"$BIN/heartbeat" "${APP_ARGS[@]}" --iters "$last" --interval-ms 0 >"$work/ref.log"
bad=$(awk 'NR==FNR { if ($1=="hb") ref[$2]=$3; next }
	$1=="hb" { n++; if (ref[$2] != $3) { bad++; print "   iteration " $2 ": " $3 " != " ref[$2] > "/dev/stderr" } }
	END { printf "%d %d\n", n, bad+0 }' "$work/ref.log" "$log")
read -r n nbad <<<"$bad"
if [ "$nbad" = 0 ]; then
	echo "   all $n heartbeats, before and after the restore, equal the uninterrupted run's checksums"
	echo; echo "demo: OK"
else
	echo "   $nbad of $n heartbeats differ"; echo; echo "demo: FAILED"; exit 1
fi
