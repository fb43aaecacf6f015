#!/usr/bin/env bash
# Checkpoint and restore in served mode on the GPU machine, beside in-process
# mode, same program, same call:
#
#   bash tests/gpu/served/served-cr.sh GPUCR_PREFIX CRIU_BUNDLE [MIB]
#
# heartbeat (tests/apps/heartbeat.c, MIB of device memory in 8 buffers,
# default 8192) under `gpucr run` (in-process) and `gpucr run --served`, in
# alternating order, ROUNDS rounds each (default 2): `gpucr checkpoint PID
# -D DIR --json` (the process ends), `gpucr restore -D DIR --json` (its
# seconds: to the process running with its GPU back), the time from the
# restore's start to its next heartbeat, whether the heartbeats go on
# from where they stopped (each compared with an uninterrupted run's), and
# the CRIU image's page files (what CRIU wrote of the process's host
# memory). Images in /dev/shm. Logs in build/gpu/served-cr (and $OUT).
# TORCH=1: PyTorch instead (tests/gpu/served/torch_rt.py: MIB of device memory,
# PyTorch's own kernels, served on served mode's runtime library; TORCH_ARGS
# more of its options, --linear for cuBLAS and cuBLASLt), compared with an
# uninterrupted run of the same script. BLASBEAT=1: blasbeat on NVIDIA's
# cuBLAS (BLASBEAT_ARGS, default --lt-per-call). TEMPLATE=1: a third mode,
# "template": served, checkpointed with --template, its image then loaded with
# `gpucr image load --template` (GPU data resident, a worker that ran its
# script: the load's seconds in load_s, outside the restore's) before the
# restore, which attaches to that worker.
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: served-cr.sh GPUCR_PREFIX CRIU_BUNDLE [MIB]" "$@"
MIB=${3:-8192}
ROUNDS=${ROUNDS:-2}
fresh_logs build/gpu/served-cr
use_criu "$C" || exit 1
BIN=${BIN:-build/gpu/bin}
[ -x "$BIN/heartbeat" ] || gpu_apps || exit 1
SOCK=/run/gpucr/served-cr.sock
HELPER=
trap 'kill $HELPER 2>/dev/null; rm -rf /dev/shm/gpucr-served-cr; [ -n "${OUT:-}" ] && tar -czf "$OUT/served-cr-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
note_host "heartbeat --mib $MIB --buffers 8"
hflags=(--log-level info --served-pool 1)
# room for the template's resident image: PyTorch's holds more than MIB (its allocator's pools, cuBLAS's
# workspaces: 12 GiB for --mib 2048 on an H200)
resident=$((MIB * 2 + 1024))
[ "${TORCH:-0}" = 1 ] && resident=$((MIB * 8 + 16384))
[ "${TEMPLATE:-0}" = 1 ] && hflags+=(--resident-memory "${resident}M")
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" "${hflags[@]}" || { bad "the helper did not answer"; exit 1; }
ARGS=(--mib "$MIB" --buffers 8 --interval-ms 100 --hb-every 1)
APP=("$BIN/heartbeat" "${ARGS[@]}")
# reference N: an uninterrupted run's first N heartbeats, "N checksum" a line
reference() { timeout 300 "$BIN/heartbeat" --mib "$MIB" --buffers 8 --interval-ms 0 --hb-every 1 --iters "$1" 2>&1 | grep '^hb' | awk '{print $2, $3}'; }
if [ "${TORCH:-0}" = 1 ]; then
	# TORCH_ARGS: more of torch_rt.py's options (--linear: cuBLASLt and cuBLAS, forwarded at their boundary)
	read -r -a targs <<<"${TORCH_ARGS:-}"
	APP=(python3 "$PWD/tests/gpu/served/torch_rt.py" --mib "$MIB" --steps 100000 --interval-ms 100 "${targs[@]}")
	reference() { timeout 300 python3 tests/gpu/served/torch_rt.py --mib "$MIB" --steps "$1" "${targs[@]}" 2>&1 | grep '^hb' | awk '{print $2, $3}'; }
elif [ "${BLASBEAT:-0}" = 1 ]; then
	# blasbeat (tests/apps/blasbeat.c) on NVIDIA's cuBLAS and cuBLASLt, with BLASBEAT_ARGS (--graph, --lt-per-call...)
	read -r -a bargs <<<"${BLASBEAT_ARGS:---lt-per-call}"
	[ -x "$BIN/blasbeat" ] || { bad "no $BIN/blasbeat (make gpu-apps found no cuBLAS)"; exit 1; }
	APP=("$BIN/blasbeat" --interval-ms 100 --hb-every 1 "${bargs[@]}")
	reference() { timeout 300 "$BIN/blasbeat" --interval-ms 0 --hb-every 1 --iters "$1" "${bargs[@]}" 2>&1 | grep '^hb' | awk '{print $2, $3}'; }
fi
for r in $(seq "$ROUNDS"); do
	order="inproc served"
	[ $((r % 2)) = 0 ] && order="served inproc"
	if [ "${TEMPLATE:-0}" = 1 ]; then
		order="inproc served template"
		[ $((r % 2)) = 0 ] && order="template served inproc"
	fi
	for m in $order; do
		flags=()
		ckflags=()
		[ "$m" != inproc ] && flags=(--served)
		[ "$m" = template ] && ckflags=(--template)
		log=$LOGS/hb.$m.$r
		img=/dev/shm/gpucr-served-cr/$m.$r
		rm -rf "$img" && mkdir -p "$img"
		# a session of its own, no terminal: what CRIU dumps without --shell-job
		setsid "$GPUCR" run "${flags[@]}" --socket "$SOCK" -- "${APP[@]}" </dev/null >"$log" 2>&1 &
		pid=$!
		for _ in $(seq 1200); do [ "$(hbs "$log")" -ge 5 ] && break; sleep 0.1; done
		rss=$(awk '/^Rss:/{r=$2} /^Private_Dirty:/{d=$2} END{printf "%.0f/%.0f", r/1024, d/1024}' "/proc/$pid/smaps_rollup")
		if ! GPUCR_SOCKET=$SOCK timeout 300 "$GPUCR" checkpoint "$pid" -D "$img" "${ckflags[@]}" --json >"$LOGS/dump.$m.$r" 2>&1; then
			bad "$m round $r: checkpoint: $(tail -2 "$LOGS/dump.$m.$r" | tr '\n' ' ')"
			kill -9 "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
			continue
		fi
		wait "$pid" 2>/dev/null
		pid_gone "$pid" || bad "$m round $r: pid $pid still there"
		n=$(hbs "$log")
		pages=$(du -cm "$img"/pages-*.img 2>/dev/null | tail -1 | cut -f1)
		load_s=-
		if [ "$m" = template ]; then
			tl=$(now)
			GPUCR_SOCKET=$SOCK timeout 300 "$GPUCR" image load "$img" --template >"$LOGS/load.$m.$r" 2>&1 || bad "$m round $r: image load --template: $(tail -2 "$LOGS/load.$m.$r" | tr '\n' ' ')"
			load_s=$(python3 -c "print(f'{$(now)-$tl:.3f}')")
			ls -l "$img"/gpucr/template-*.script >>"$LOGS/load.$m.$r" 2>&1
		fi
		t0=$(now)
		GPUCR_SOCKET=$SOCK timeout 300 "$GPUCR" restore -D "$img" --json >"$LOGS/restore.$m.$r" 2>&1 || bad "$m round $r: restore: $(tail -2 "$LOGS/restore.$m.$r" | tr '\n' ' ')"
		t1=$(next_heartbeat "$log" "$n")
		sleep 1
		kill -9 "$pid" 2>/dev/null
		pid_gone "$pid"
		[ "$m" = template ] && GPUCR_SOCKET=$SOCK "$GPUCR" image unload "$img" >/dev/null 2>&1
		echo "$m $r $(jf "$LOGS/dump.$m.$r" seconds) $(jf "$LOGS/restore.$m.$r" seconds) $(python3 -c "print(f'{${t1:-$t0}-$t0:.3f}' if '${t1}' else 'none')") ${pages:-?} $rss $load_s" >>"$LOGS/times.txt"
		# exactness: each heartbeat after the restore against an uninterrupted run's
		want=$(reference "$(grep -c '^hb' "$log")")
		got=$(grep '^hb' "$log" | awk '{print $2, $3}')
		if [ "$(echo "$got" | sort -n | uniq)" = "$(echo "$want" | sort -n | uniq | head -n "$(echo "$got" | sort -n | uniq | wc -l)")" ]; then
			note "  $m round $r: heartbeats equal to an uninterrupted run's (through iteration $(echo "$got" | tail -1 | cut -d' ' -f1))"
		else
			bad "$m round $r: heartbeats differ from an uninterrupted run's"
		fi
	done
done
note "## checkpoint (process ends) and restore to its next heartbeat, ${APP[*]}"
note "  mode round dump_s restore_s restore_to_hb_s criu_pages_MiB rss/private_dirty_MiB_before load_s"
note "  (restore_s: the restore command, to the process running with its GPU back; restore_to_hb_s adds heartbeat's"
note "  own time to its next heartbeat, which checksums every buffer)"
sed 's/^/  /' "$LOGS/times.txt" | tee -a "$LOGS/summary.txt"
exit $fail
