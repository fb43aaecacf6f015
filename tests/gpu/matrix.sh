#!/usr/bin/env bash
# The workload matrix: real GPU programs checkpointed mid-run with `gpucr
# checkpoint` and restored with `gpucr restore`, each compared with an
# uninterrupted run, in one call on the GPU machine:
#
#   bash tests/gpu/matrix.sh GPUCR_PREFIX CRIU_BUNDLE
#
# GPUCR_PREFIX: scripts/make-gpucr-bundle.sh output; CRIU_BUNDLE:
# scripts/make-criu-bundle.sh output (put first on PATH, as users would).
# ROWS (default: all below) picks rows; STEPS (default 1200) the steps of the
# Python programs, C_ITERS (default 1200) the iterations of the C ones. Under
# gpucr a step takes at least 40 ms, so that every program is still running
# when its turn to be checkpointed comes.
#
#  1. `gpucr check` with the helper (the host, CRIU, plugin, driver).
#  2. Every program under `gpucr run`, all at once, a step every 40 ms, with
#     no fixed end. Row by row, once it is past step 30:
#       dump     gpucr checkpoint PID -D DIR (the tree ends), gpucr restore -D DIR
#       again    --leave-running, dump + restore, --leave-running, dump + restore
#       fail     gpucr checkpoint must fail (CRIU cannot dump a forked worker
#                that keeps the driver's files: GPUCR_FORK_SCRUB=0); the
#                program must run again within a second of the CLI's exit
#       refuse   nothing: the program's own use must be refused, clearly
#     then 20 more steps, and the program is stopped: N steps in all.
#  3. Every program twice without gpucr, N steps, at full speed, all at once:
#     both runs must print the same lines (or a comparison means nothing:
#     tests/gpu/matrix_workloads.py says how each is made deterministic), and
#     the run under gpucr exactly those lines.
#  4. On a machine with 2 GPUs: tests/gpu/ddp.sh, a 2-rank DDP job plain and
#     under gpucr run, with the same losses.
# Images in /dev/shm. Logs in build/gpu/matrix (and $OUT): summary.txt holds
# the table. LEAVE_RUNNING_FLAGS (say --concurrent) go to every --leave-running
# checkpoint of the "again" rows.
#
# SIM=1: on the simulated driver (no GPU; the C programs only), to try the
# script itself: SIM=1 bash tests/gpu/matrix.sh build /opt/gpucr/criu
# (GPUCR_PREFIX a build directory: bin/gpucr, lib/...).
#
# SERVED=1: the same rows in served mode (docs/served-mode.md): every program
# under `gpucr run --served`, its CUDA calls run by a worker of the helper's
# pool, the helper started with --served-pool SERVED_POOL (default: the
# number of rows, since every program runs at once and each is one served
# process; a restore, or a --leave-running checkpoint letting its process go
# on, takes a fresh worker, and the pool refills behind each take). Step 3's
# plain runs and the exactness check are the same. Where a row means
# something else served (SERVED_ROWS below says why, row by row):
#   fail     dump: the checkpoint must succeed and the restored run be
#            exact, for a served process holds no driver files, so its
#            forked children, GPUCR_FORK_SCRUB=0 or not, hold none either
#   refuse   as in-process, and gpucr must also say on the program's stderr
#            that served mode refuses the call (its one line)
#   cannot   a program served mode does not run yet (JAX, CuPy): it runs
#            served all the same, and its row is "not served" if gpucr
#            refused it with its line before step 30, FAIL if it ended
#            otherwise, and a dump row if it runs after all
# Step 4 (DDP) is not run served, and its row says why. The table's "mode"
# column says in which mode each row ran. Logs in build/gpu/matrix-served
# (and $OUT/matrix-served-*): both modes can run in one device call.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: matrix.sh GPUCR_PREFIX CRIU_BUNDLE"
prefix_criu_args "$usage" "$@"
abs_dir "$usage" C
SIM=${SIM:-}
BIN=build/gpu/bin
if [ -n "$SIM" ]; then
	BIN=build/bin
	export LD_LIBRARY_PATH=$PWD/build/sim GPUCR_LIBCUDA=$PWD/build/sim/libcuda.so.1
	ROWS=${ROWS:-vmmapp workers_c workers_c_failed_dump}
fi
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0"
export CUPY_ACCELERATORS=""
C_MIB=${C_MIB:-256}
# Every wait ends by DEADLINE seconds after the start (default 480): what is
# unfinished then is reported so, and the logs still reach $OUT.
DEADLINE=${DEADLINE:-480}
T_START=$(date +%s)
left() { echo $((T_START + DEADLINE - $(date +%s))); }
# TAG names the logs, images and $OUT files: apart for served mode.
SERVED=${SERVED:-0}
TAG=matrix
[ "$SERVED" = 1 ] && TAG=matrix-served
IMG=${IMG:-/dev/shm/gpucr-$TAG}
W=$PWD/tests/gpu/matrix_workloads.py
fresh_logs "build/gpu/$TAG"
rm -rf "$IMG" && mkdir -p "$IMG"
# On PATH, not in GPUCR_CRIU (use_criu): the matrix keeps gpucr's own
# lookup of CRIU on PATH.
C=$(root_bundle "$C") || exit 1
export PATH="$C/bin:$PATH"

# name | mode | environment | command (python workload, or app:ARGS of $BIN)
# (in the order they are checkpointed: torch.compile's first step compiles
# for a minute, so it comes last)
ALL_ROWS="
dataloader|dump||train_dataloader
dataloader_expandable|dump|PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True|train_dataloader
dataloader_failed_dump|fail|GPUCR_FORK_SCRUB=0|train_dataloader
restored_again|again||train_plain
cuda_graph|dump||cuda_graph
streams|dump||streams
kv_cache|dump||kv_cache
jax|dump||jax
cupy|dump||cupy
vmmapp|dump||app:vmmapp --mib $C_MIB --hb-every 5
workers_c|dump||app:heartbeat --mib $C_MIB --workers 2 --hb-every 5
workers_c_failed_dump|fail|GPUCR_FORK_SCRUB=0|app:heartbeat --mib 64 --workers 2 --hb-every 5
compile|dump||compile
ipc|refuse||ipc
cuda_graph_window|again||cuda_graph
streams_window|again||streams
compile_window|again||compile
expandable_window|again|PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True|train_dataloader
graph_c_window|again||app:heartbeat --mib $C_MIB --graph --hb-every 5
"
# The *_window rows (leave-running checkpoints of CUDA graphs, streams,
# torch.compile, expandable segments, for LEAVE_RUNNING_FLAGS=--concurrent)
# run only when ROWS names them.
ROWS=${ROWS:-$(printf '%s\n' "$ALL_ROWS" | cut -d'|' -f1 | grep -v '_window$' | xargs)}
row() { printf '%s\n' "$ALL_ROWS" | awk -F'|' -v n="$1" '$1 == n'; }
field() { row "$1" | cut -d'|' -f"$2"; }

# Served mode (SERVED=1): the rows whose mode differs there, and why.
# name | mode served | why
SERVED_ROWS="
dataloader_failed_dump|dump|a served process holds no driver files, so its forked DataLoader workers hold none either, GPUCR_FORK_SCRUB=0 or not: nothing is left that CRIU cannot dump
workers_c_failed_dump|dump|a served process holds no driver files, so its forked workers hold none either, GPUCR_FORK_SCRUB=0 or not: nothing is left that CRIU cannot dump
jax|cannot|JAX's XLA calls cuDNN, cuFFT and cuSPARSE too (docs/served-mode.md), which served mode does not forward: cuDNN carries NVIDIA's CUDA runtime inside it, which asks for the driver's private export tables
cupy|cannot|CuPy's wheels carry NVIDIA's static CUDA runtime, which asks for the driver's private export tables; served mode runs only its own runtime, cuBLAS and cuBLASLt (docs/served-mode.md)
"
served_field() { printf '%s\n' "$SERVED_ROWS" | awk -F'|' -v n="$1" '$1 == n' | cut -d'|' -f"$2"; }
# mode_of NAME: what row NAME does in this run's mode.
mode_of() {
	local m
	[ "$SERVED" = 1 ] && m=$(served_field "$1" 2)
	echo "${m:-$(field "$1" 2)}"
}
# refusal ERRLOG: the last line where gpucr says on a served program's
# stderr that served mode refuses what it asked (the served library's
# "gpucr: served mode: X is not supported" and its refusal of the export
# tables, "... (CUDA_ERROR_NOT_SUPPORTED)", its runtime's "gpucr runtime: X:
# ... not provided", its cuBLAS's "... not forwarded ..."), or nothing. The
# last: a program may have got past an earlier one.
refusal() { grep -hiE '^gpucr( runtime)?: .*not[ _](supported|provided|forwarded)' "$1" 2>/dev/null | tail -1 | cut -c1-300; }

# lines LOG: what must equal between runs (hb lines without their time).
lines() { awk '$1 == "step" || ($1 == "hb" && NF >= 3) { if ($1 == "hb") print $1, $2, $3; else print }' "$1" 2>/dev/null; }
steps() { lines "$1" | wc -l; }
# last_iter LOG: the iteration of LOG's last line.
last_iter() { lines "$1" | tail -1 | awk '{print $2}'; }
# start NAME LOG MODE [N]: a run of row NAME in the background, its output to
# LOG. MODE gpucr: under gpucr run (--served with SERVED=1), slowed down, with
# no end; plain: at full speed, up to step (C programs: iteration) N.
start() {
	local name=$1 log=$2 mode=$3 n=${4:-} env cmd delay=0.04
	env=$(field "$name" 3)
	cmd=$(field "$name" 4)
	[ "$mode" = plain ] && delay=0
	case $cmd in
	app:*)
		if [ "$mode" = plain ]; then
			cmd="$BIN/${cmd#app:} --iters $n --interval-ms 0"
		else
			cmd="$BIN/${cmd#app:} --interval-ms 40"
		fi
		;;
	*) cmd="python3 $W $cmd $log ${n:-1000000000}" ;;
	esac
	if [ "$mode" = plain ]; then
		# shellcheck disable=SC2086
		(env $env MATRIX_DELAY=0 setsid $cmd </dev/null >>"$log" 2>"$log.err") &
		PLAIN+=($!)
	elif [ "$SERVED" = 1 ]; then
		# Served: the exit status goes to LOG.exit, so that a program that
		# served mode refuses ends its wait for step 30 at once (not the
		# 300 s an in-process row waits for a program that died without
		# "done"). It means the program's end only until its first
		# checkpoint, which ends the original process too. JAX_PLATFORMS:
		# JAX must fail where it cannot use the GPU, not go on on the CPU.
		# shellcheck disable=SC2086
		(
			env $env JAX_PLATFORMS=cuda MATRIX_DELAY=$delay setsid "$GPUCR" run --served --socket "$SOCK" -- $cmd </dev/null >>"$log" 2>"$log.err"
			echo $? >"$log.exit"
		) &
	else
		# shellcheck disable=SC2086
		(env $env MATRIX_DELAY=$delay setsid "$GPUCR" run --socket "$SOCK" -- $cmd </dev/null >>"$log" 2>"$log.err") &
	fi
}
# wait_steps LOG N SECONDS [EXIT]: until LOG holds N step lines (or its
# program ended: LOG's "done", or the file EXIT, start's LOG.exit, is there;
# or the deadline came).
wait_steps() {
	local t=$3
	[ "$t" -le "$(left)" ] || t=$(left)
	[ "$t" -gt 0 ] || return 1
	for _ in $(seq $((t * 10))); do
		[ "$(steps "$1")" -ge "$2" ] && return 0
		grep -q '^done' "$1" 2>/dev/null && return 1
		[ -n "${4:-}" ] && [ -e "$4" ] && return 1
		sleep 0.1
	done
	return 1
}
# tree PID: PID and its descendants.
tree() {
	local p c
	for p in "$@"; do
		echo "$p"
		for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do tree "$c"; done
	done
}
# gone PIDS...: until no /proc entry is left for them (zombies reaped too: a
# restore needs their pids), at most 10 s.
gone() {
	local p
	for _ in $(seq 200); do
		for p in "$@"; do [ -e "/proc/$p" ] && break; p=; done
		[ -z "$p" ] && return 0
		sleep 0.05
	done
	return 1
}
pid_of() { sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$1" | tail -1; }

if [ -n "$SIM" ]; then
	note "host: simulated driver; $(criu --version | head -1)"
else
	note_host "$(criu --version | head -1); $(python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)"
	make -s gpu-apps >"$LOGS/make.txt" 2>&1 || bad "make gpu-apps: $(tail -3 "$LOGS/make.txt")"
fi

SOCK=/run/gpucr/helper.sock
mkdir -p /run/gpucr
HELPER=
# The logs reach $OUT whatever happens (a timeout's SIGTERM included).
save() {
	if [ -n "${OUT:-}" ]; then
		cp "$LOGS/summary.txt" "$OUT/$TAG-summary.txt" 2>/dev/null
		tar -czf "$OUT/$TAG-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
	fi
}
stop_all() {
	pkill -9 -f matrix_workloads.py 2>/dev/null
	pkill -9 -f "$BIN/" 2>/dev/null
}
finish() {
	save
	kill $HELPER 2>/dev/null
	stop_all
	rm -rf "$IMG"
}
trap finish EXIT
trap 'note "TERMINATED after $(($(date +%s) - T_START)) s"; exit 1' TERM INT
HFLAGS=(--log-level info)
if [ "$SERVED" = 1 ]; then
	# a worker for each program running at once (a forked child that
	# initialises CUDA itself would take one more, started then)
	SERVED_POOL=${SERVED_POOL:-$(echo "$ROWS" | wc -w)}
	HFLAGS+=(--served-pool "$SERVED_POOL")
fi
# HELPER_FLAGS: say --concurrent-mode copy-on-write, with LEAVE_RUNNING_FLAGS=--concurrent.
# shellcheck disable=SC2086
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" "${HFLAGS[@]}" ${HELPER_FLAGS:-} || bad "the helper did not answer"
if [ "$SERVED" = 1 ]; then
	# The programs start once the pool is full (each then takes a worker
	# whose context is made, as served mode is meant to run), or after 60 s.
	pool_full() { "$GPUCR" status --json --socket "$SOCK" 2>/dev/null | grep -q "\"idle\":\[${SERVED_POOL}[],]"; }
	t0=$(now)
	for _ in $(seq 600); do
		pool_full && break
		sleep 0.1
	done
	if pool_full; then
		note "mode: served (gpucr run --served; helper --served-pool $SERVED_POOL: $SERVED_POOL idle workers on device 0 after $(span "$t0" "$(now)"))"
	else
		bad "mode: served, but the pool did not get $SERVED_POOL idle workers in 60 s: $("$GPUCR" status --socket "$SOCK" 2>&1 | grep served)"
	fi
fi

note ""
note "## gpucr check"
if "$GPUCR" check --socket "$SOCK" -D /dev/shm >"$LOGS/check.txt" 2>&1; then note "gpucr check: exit 0"; else bad "gpucr check: exit $?"; fi
sed 's/^/    /' "$LOGS/check.txt" | tee -a "$LOGS/summary.txt" >/dev/null

# 2. under gpucr, all at once, row by row.
for r in $ROWS; do start "$r" "$LOGS/$r.gpucr" gpucr; done
declare -A RESULT DETAIL
cli() { # cli LOGNAME ARGS...: gpucr ARGS, output appended to LOGS/LOGNAME.cli; sets CLI_RC, CLI_S
	local t=$(now)
	echo "+ gpucr ${*:2}" >>"$LOGS/$1.cli"
	"$GPUCR" "${@:2}" --socket "$SOCK" --criu-timeout 90s >>"$LOGS/$1.cli" 2>&1
	CLI_RC=$?
	CLI_S=$(span "$t" "$(now)")
}
for r in $ROWS; do
	log=$LOGS/$r.gpucr
	mode=$(mode_of "$r")
	note "$(($(date +%s) - T_START)) s: $r"
	save
	if [ "$mode" = refuse ]; then
		wait_steps "$log" 1 120 "$log.exit"
		for _ in $(seq 100); do grep -q '^done' "$log" && break; sleep 0.1; done
		continue
	fi
	if ! wait_steps "$log" 30 300 "$log.exit"; then
		why=
		[ "$SERVED" = 1 ] && why=$(refusal "$log.err")
		ended=
		[ -e "$log.exit" ] && ended=" (it exited with status $(cat "$log.exit") after $(steps "$log") steps)"
		if [ "$mode" = cannot ] && [ -n "$why" ]; then
			# what served mode does not run must be refused, clearly
			RESULT[$r]="not served"
			DETAIL[$r]="$(served_field "$r" 3). gpucr refused it at the call$ended: $why"
		else
			RESULT[$r]=FAIL
			DETAIL[$r]="never reached step 30 under gpucr$ended: $(tail -c 300 "$log.err" | tr '\n' ' ')${why:+ (served mode refused: $why)}"
		fi
		continue
	fi
	pid=$(pid_of "$log")
	d=""
	case $mode in
	dump | again | cannot) # cannot: served mode ran it after all
		round=0
		for op in $([ "$mode" = again ] && echo "leave dump leave dump" || echo dump); do
			round=$((round + 1))
			img=$IMG/$r.$round
			n=$(steps "$log")
			if [ "$op" = leave ]; then
				cli "$r" checkpoint "$pid" -D "$img" --leave-running ${LEAVE_RUNNING_FLAGS:-}
				[ $CLI_RC = 0 ] || { RESULT[$r]=FAIL; d+="checkpoint --leave-running failed: $(grep '^gpucr:\|^  criu:\|^  gpucr_plugin:' "$LOGS/$r.cli" | tail -3 | tr '\n' ' '); "; break; }
				d+="leave-running $CLI_S; "
				wait_steps "$log" $((n + 10)) 60 || { RESULT[$r]=FAIL; d+="no step after --leave-running; "; break; }
				continue
			fi
			pids=$(tree "$pid" | xargs)
			cli "$r" checkpoint "$pid" -D "$img"
			[ $CLI_RC = 0 ] || { RESULT[$r]=FAIL; d+="checkpoint failed: $(grep '^gpucr:\|^  criu:\|^  gpucr_plugin:' "$LOGS/$r.cli" | tail -3 | tr '\n' ' '); "; break; }
			ck=$CLI_S
			size=$(du -sm "$img" | cut -f1)
			# shellcheck disable=SC2086
			gone $pids || d+="(pids $pids still there 10 s after the dump) "
			n=$(steps "$log")
			tr0=$(now)
			cli "$r" restore -D "$img"
			[ $CLI_RC = 0 ] || { RESULT[$r]=FAIL; d+="restore failed: $(grep '^gpucr:\|^  criu:\|^  gpucr_plugin:' "$LOGS/$r.cli" | tail -3 | tr '\n' ' '); "; break; }
			rs=$CLI_S
			wait_steps "$log" $((n + 1)) 60 && nx=$(span "$tr0" "$(now)") || nx=never
			d+="checkpoint $ck (${size} MB), restore $rs, next step after $nx; "
			[ "$nx" = never ] && { RESULT[$r]=FAIL; break; }
		done
		;;
	fail)
		n=$(steps "$log")
		cli "$r" checkpoint "$pid" -D "$IMG/$r"
		t1=$(now)
		if [ $CLI_RC = 0 ]; then
			RESULT[$r]=FAIL
			d="the checkpoint succeeded, but should have failed"
		else
			wait_steps "$log" $((n + 1)) 5 && back=$(span "$t1" "$(now)") || back="not within 5 s"
			why=$(grep '^  criu:\|^  gpucr_plugin:' "$LOGS/$r.cli" | head -2 | tr '\n' ' ')
			# refused before CRIU ran: gpucr's own one-line reason
			[ -n "$why" ] || why=$(grep '^gpucr: ' "$LOGS/$r.cli" | head -1)
			d="checkpoint failed as expected ($CLI_S): ${why:0:200}; running again $back after the CLI exited; "
			case $back in not*) RESULT[$r]=FAIL ;; esac
		fi
		;;
	esac
	# 20 more steps, then this one is done.
	n=$(steps "$log")
	wait_steps "$log" $((n + 20)) 60 || { [ "${RESULT[$r]:-}" = FAIL ] || d+="no 20 steps after: $(tail -c 200 "$log.err" | tr '\n' ' ') "; RESULT[$r]=FAIL; }
	# shellcheck disable=SC2046
	kill -9 $(tree "$(pid_of "$log")") 2>/dev/null
	DETAIL[$r]=$d
done
stop_all

# 3. the plain runs, as long as the runs under gpucr, twice, all at once.
PLAIN=()
t0=$(now)
for r in $ROWS; do
	[ "$(mode_of "$r")" = refuse ] && continue
	[ "${RESULT[$r]:-}" = "not served" ] && continue
	n=$(last_iter "$LOGS/$r.gpucr")
	[ -n "$n" ] || continue
	case $(field "$r" 4) in app:*) ;; *) n=$((n + 1)) ;; esac # python steps count from 0
	start "$r" "$LOGS/$r.plain1" plain "$n"
	start "$r" "$LOGS/$r.plain2" plain "$n"
done
[ ${#PLAIN[@]} -gt 0 ] && wait "${PLAIN[@]}"
note ""
note "plain runs (2 per program, at once): $(span "$t0" "$(now)")"

for r in $ROWS; do
	log=$LOGS/$r.gpucr
	if [ "$(mode_of "$r")" = refuse ]; then
		# served: gpucr must also have said that served mode refuses the call
		why=
		[ "$SERVED" = 1 ] && why=$(refusal "$log.err")
		if grep -q 'refused' "$log" && { [ "$SERVED" != 1 ] || [ -n "$why" ]; }; then
			RESULT[$r]=refused
			DETAIL[$r]="the program's own call is refused: ${why:-$(grep -h 'gpucr:' "$log.err" | head -1 | cut -c1-160)} / $(grep refused "$log" | cut -c1-160)"
		elif grep -q 'refused' "$log"; then
			RESULT[$r]=FAIL
			DETAIL[$r]="refused, but gpucr said nothing on stderr of served mode refusing it: $(grep refused "$log" | cut -c1-160) / $(tail -c 200 "$log.err" | tr '\n' ' ')"
		else
			RESULT[$r]=FAIL
			DETAIL[$r]="not refused: $(tail -2 "$log" | tr '\n' ' ')"
		fi
		continue
	fi
	case ${RESULT[$r]:-} in FAIL | "not served") continue ;; esac
	det=yes
	[ "$(lines "$LOGS/$r.plain1")" = "$(lines "$LOGS/$r.plain2")" ] || det=no
	if [ $det = no ]; then
		RESULT[$r]=FAIL
		DETAIL[$r]+="two plain runs differ (not deterministic): $(diff <(lines "$LOGS/$r.plain1") <(lines "$LOGS/$r.plain2") | head -3 | tr '\n' ' ')"
	elif [ "$(lines "$log")" = "$(lines "$LOGS/$r.plain1")" ]; then
		RESULT[$r]=pass
	else
		RESULT[$r]=FAIL
		DETAIL[$r]+="output differs from the uninterrupted run: $(diff <(lines "$LOGS/$r.plain1") <(lines "$log") | head -3 | tr '\n' ' ')"
	fi
	DETAIL[$r]+=" $(steps "$log") lines equal to a plain run's; two plain runs identical: $det"
done
MODE=in-process
[ "$SERVED" = 1 ] && MODE=served
note ""
note "| row | mode | how | result | details |"
note "|---|---|---|---|---|"
for r in $ROWS; do
	# how: the row's mode in this run, and the in-process one where it differs
	how=$(mode_of "$r")
	[ "$how" != "$(field "$r" 2)" ] && how+=" (in-process: $(field "$r" 2))"
	if [ "$SERVED" = 1 ]; then
		why=$(refusal "$LOGS/$r.gpucr.err")
		if [ "${RESULT[$r]:-}" = FAIL ] && [ -n "$why" ] && [[ ${DETAIL[$r]:-} != *"$why"* ]]; then
			DETAIL[$r]+=" (served mode refused: $why)"
		fi
		if [ "$(mode_of "$r")" = cannot ] && [ "${RESULT[$r]:-}" = pass ]; then
			DETAIL[$r]+=" (served mode ran it, though SERVED_ROWS lists it as a program it cannot run: mend SERVED_ROWS)"
		elif [ "$(mode_of "$r")" != "$(field "$r" 2)" ] && [ "${RESULT[$r]:-}" != "not served" ]; then
			DETAIL[$r]="served: $(served_field "$r" 3). ${DETAIL[$r]:-}"
		fi
	fi
	note "| $r | $MODE | $how$([ -n "$(field "$r" 3)" ] && echo " ($(field "$r" 3))") | ${RESULT[$r]:-?} | ${DETAIL[$r]:-} |"
	[ "${RESULT[$r]:-?}" = FAIL ] && fail=1
done

# 4. On a machine with 2 GPUs (DDP=0 leaves it out): a 2-rank DDP job, plain
# and under gpucr run, served by the same helper (tests/gpu/ddp.sh); each run
# may take half the time left, at most 240 s. Not served: DDP's ranks talk
# through NCCL, which served mode does not forward (gpucr run --served puts
# only its own runtime, cuBLAS and cuBLASLt in the program); the row says so.
if [ -z "$SIM" ] && [ "${DDP:-1}" = 1 ] && [ "$SERVED" = 1 ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
	note ""
	note "| ddp_2ranks | served | - | not run | served mode does not forward NCCL, which DDP's ranks use (its own runtime, cuBLAS and cuBLASLt only); the matrix without SERVED runs it in-process |"
elif [ -z "$SIM" ] && [ "${DDP:-1}" = 1 ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
	lim=$((($(left) - 20) / 2))
	[ $lim -gt 240 ] && lim=240
	note ""
	if [ $lim -lt 45 ]; then
		bad "ddp_2ranks: not run, $(left) s left"
	else
		SOCK=$SOCK LOGS=$LOGS/ddp LIMIT=$lim bash tests/gpu/ddp.sh "$G" >"$LOGS/ddp.txt" 2>&1
		rc=$?
		cat "$LOGS/ddp/summary.txt" >>"$LOGS/summary.txt"
		if [ $rc = 0 ]; then note "| ddp_2ranks | in-process | plain, then gpucr run | pass |"; else bad "ddp_2ranks: see above"; fi
	fi
fi
grep -i '"level":"\(warn\|error\)"' "$LOGS/helper.log" | tail -20 >"$LOGS/helper-warnings.txt"
note "matrix: $(($(date +%s) - T_START)) s"
exit $fail
