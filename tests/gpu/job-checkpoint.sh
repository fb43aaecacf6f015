#!/usr/bin/env bash
# `gpucr job checkpoint` and `gpucr job restore` of a DDP job across two
# "hosts" on one 2-GPU machine (nvidia-h100-x2 or nvidia-h200-x2):
#
#   bash tests/gpu/job-checkpoint.sh GPUCR_PREFIX CRIU_BUNDLE
#
# Host A is this machine's own namespaces; host B is a pid, mount and UTS
# namespace (hostname gpucr-host-b) with a gpucr helper of its own and its
# own image directory bound over the job's path. Each host has one GPU
# (CUDA_VISIBLE_DEVICES) and runs one rank of tests/gpu/ddp.py (2 DataLoader
# workers) under `gpucr run`, started with env:// (rank 0 on A hosts the
# TCPStore). NCCL runs over sockets between the hosts (NCCL_NET=Socket, P2P
# and SHM off; the hostnames differ, so NCCL takes them for two nodes): the
# ranks share no GPU memory, and each rank's collective kernels spin until
# the other host's proxy has sent its data. This machine has no ip(8) nor
# sshd: the hosts share the network namespace (their connections go over
# lo), and `--ssh` is a stand-in that runs the command line on host A as
# is and on host B inside its namespaces with nsenter; everything else is
# gpucr job as users run it. In one call:
#
#  1. the job plain (no gpucr), for the reference: every step's loss and
#     gradient norm;
#  2. under gpucr: `gpucr job checkpoint --leave-running` (the job must run
#     on at once), then `gpucr job checkpoint` (both ranks stopped), then
#     `gpucr job restore`; the restored job runs to its end. Every step's
#     line equals the reference's. The reports' times go to the summary.
# LAUNCH=torchrun: each host is instead a node of the same script under
# torchrun (--nnodes 2 --node-rank N --nproc-per-node 1), unchanged: torchrun
# itself for the reference, `gpucr torchrun` under gpucr, whose launcher
# is each host's part.
# Images in /dev/shm. Logs in build/gpu/job (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: job-checkpoint.sh GPUCR_PREFIX CRIU_BUNDLE" "$@"
PY=${PYTHON:-python3}
STEPS=${STEPS:-400}
LAUNCH=${LAUNCH:-env} # env: each host starts its rank (env://); torchrun: each host a node of torchrun
fresh_logs build/gpu/job
use_criu "$C" || { bad "the CRIU bundle $C"; exit 1; }
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo USE_LIBUV=0
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1 DDP_DELAY=${DDP_DELAY:-0.03}
DEADLINE=${DEADLINE:-480}
T_START=$(date +%s)
left() { echo $((T_START + DEADLINE - $(date +%s))); }
RA=/run/gpucr-job-a
RB=/run/gpucr-job-b
SA=$RA/helper.sock
SB=$RB/helper.sock
IMG=/dev/shm/gpucr-job/img
IMGB=/dev/shm/gpucr-job/b
RUNNING=/dev/shm/gpucr-job/running
RUNNINGB=/dev/shm/gpucr-job/running-b
rm -rf "$RA" "$RB" /dev/shm/gpucr-job && mkdir -p "$RA" "$RB" "$IMG" "$IMGB" "$RUNNING" "$RUNNINGB"
UNSHARE=
HA=
cleanup() {
	pkill -9 -f "tests/gpu/ddp.py" 2>/dev/null
	[ -n "$UNSHARE" ] && kill -9 "$UNSHARE" 2>/dev/null
	[ -n "$HA" ] && kill "$HA" 2>/dev/null
	rm -rf /dev/shm/gpucr-job
	if [ -n "${OUT:-}" ]; then
		cp "$LOGS/summary.txt" "$OUT/job-summary.txt" 2>/dev/null
		tar -czf "$OUT/job-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
	fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

note_host "torch $($PY -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())')"
start_helper "$GPUCR" "$SA" "$LOGS/helper-a.log" --log-level info || { bad "host A's helper does not start"; exit 1; }
HA=$HELPER
# Host B: its init (a python loop that reaps every child) names the host,
# binds its own image directories over the job's paths and starts its helper.
unshare --pid --fork --kill-child --mount --mount-proc --uts $PY -c "
import os, socket, subprocess, time
socket.sethostname('gpucr-host-b')
subprocess.check_call(['mount', '--bind', '$IMGB', '$IMG'])
subprocess.check_call(['mount', '--bind', '$RUNNINGB', '$RUNNING'])
subprocess.Popen(['$GPUCR', 'helper', '--socket', '$SB', '--log-level', 'info'], stdout=open('$LOGS/helper-b.log', 'a'), stderr=subprocess.STDOUT)
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
	[ -n "$TPID" ] && nsenter -t "$TPID" -p -m -- "$GPUCR" status --socket "$SB" >/dev/null 2>&1 && break
	sleep 0.1
done
nsenter -t "$TPID" -p -m -- "$GPUCR" status --socket "$SB" >"$LOGS/helper-b-status.txt" 2>&1 || { bad "host B's helper does not answer"; exit 1; }
# on_b CMD...: CMD on host B
on_b() { nsenter -t "$TPID" -p -m -u -- "$@"; }
NSSSH=$LOGS/nsssh
cat >"$NSSSH" <<EOF
#!/bin/sh
# the ssh stand-in: HOST COMMAND-LINE
case "\$1" in
*host-a) exec env GPUCR_SOCKET=$SA /bin/sh -c "\$2" ;;
*host-b) exec nsenter -t $TPID -p -m -u -- env GPUCR_SOCKET=$SB /bin/sh -c "\$2" ;;
*) echo "nsssh: no host \$1" >&2; exit 255 ;;
esac
EOF
chmod 755 "$NSSSH"
JOBFLAGS=(--ssh "$NSSSH" --remote-gpucr "env GPUCR_CRIU=$GPUCR_CRIU $GPUCR")

# start_rank RANK PORT OUT [gpucr]: one rank of ddp.py on its host (rank 0
# on A, GPU 0; rank 1 on B, GPU 1), in a session of its own; its pid (in
# its host's pid namespace) in $LOGS/rankRANK.pid. Host B's rank is started
# from inside B by Python, its standard descriptors opened there and every
# other one closed: a descriptor of this shell's (opened in A's mount
# namespace) would be one B's CRIU cannot dump ("Can't lookup mount").
start_rank() {
	local r=$1 port=$2 out=$3 under=${4:-} sock=$SA
	[ "$r" = 1 ] && sock=$SB
	# absolute: nsenter starts host B's rank in B's root directory
	local argv=($PY "$PWD/tests/gpu/ddp.py" "$out" "$STEPS")
	local envs=(CUDA_VISIBLE_DEVICES="$r" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK="$r" LOCAL_RANK=0 WORLD_SIZE=2)
	if [ "$LAUNCH" = torchrun ]; then
		# the script unchanged, one node a host: torchrun itself for the
		# reference, gpucr torchrun under gpucr
		local tr=(--nnodes 2 --node-rank "$r" --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port"
			"$PWD/tests/gpu/ddp.py" "$out" "$STEPS")
		argv=(torchrun "${tr[@]}")
		[ -n "$under" ] && argv=("$GPUCR" torchrun --socket "$sock" "${tr[@]}")
		envs=(CUDA_VISIBLE_DEVICES="$r")
	elif [ -n "$under" ]; then
		argv=("$GPUCR" run --socket "$sock" -- "${argv[@]}")
	fi
	local pre=()
	[ "$r" = 1 ] && pre=(nsenter -t "$TPID" -p -m -u --)
	"${pre[@]}" env "${envs[@]}" $PY -c "
import subprocess, sys
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=open(sys.argv[1], 'ab'), stderr=subprocess.STDOUT,
                     start_new_session=True, close_fds=True)
print(p.pid)" "$LOGS/rank$r-$(basename "$out").out" "${argv[@]}" >"$LOGS/rank$r.pid"
}
# steps FILE: the number of step lines in FILE
steps() {
	local n
	n=$(grep -c '^step ' "$1" 2>/dev/null)
	echo "${n:-0}"
}
# ranks_alive: both ranks' launchers still run (a rank that died, e.g. one
# that could not start, fails the wait at once instead of at its deadline)
# (a zombie counts as dead: pid 1 here may be slow to reap it)
ranks_alive() {
	local st='s=$(cut -d" " -f3 /proc/$0/stat 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ]'
	sh -c "$st" "$(cat "$LOGS/rank0.pid")" && on_b sh -c "$st" "$(cat "$LOGS/rank1.pid")"
}
# wait_steps FILE N [S]: until FILE has N step lines (at most S seconds, default 120)
wait_steps() {
	local i
	for i in $(seq $((${3:-120} * 10))); do
		[ "$(steps "$1")" -ge "$2" ] && return 0
		[ $((i % 10)) = 0 ] && ! ranks_alive && return 1
		sleep 0.1
	done
	return 1
}
# wait_done FILE S: until FILE has its "done" line (at most S seconds)
wait_done() {
	local i
	for i in $(seq $(($2 * 10))); do
		grep -q '^done' "$1" 2>/dev/null && return 0
		[ $((i % 10)) = 0 ] && ! ranks_alive && { grep -q '^done' "$1" 2>/dev/null; return; }
		sleep 0.1
	done
	return 1
}

note ""
note "## the job plain, for the reference ($STEPS steps)"
REF=$LOGS/ref.txt
start_rank 0 29511 "$REF"
start_rank 1 29511 "$REF.b"
wait_done "$REF" 180 || bad "the plain job did not end: $(tail -n 3 "$LOGS/rank0-ref.txt.out" "$LOGS/rank1-ref.txt.b.out")"
note "reference: $(steps "$REF") steps"
pkill -9 -f "tests/gpu/ddp.py" 2>/dev/null
sleep 2

note ""
note "## under gpucr run: job checkpoint running on, job checkpoint, job restore"
note "| step | result | seconds | every part frozen (s) | GPU processes at one point (s) | collectives counted |"
note "|---|---|---|---|---|---|"
J=$LOGS/job.txt
start_rank 0 29512 "$J" gpucr
start_rank 1 29512 "$J.b" gpucr
wait_steps "$J" 40 180 || bad "the job under gpucr does not reach step 40: $(tail -n 3 "$LOGS/rank0-job.txt.out" "$LOGS/rank1-job.txt.b.out")"
PA=$(cat "$LOGS/rank0.pid")
PB=$(cat "$LOGS/rank1.pid")
note "ranks: host A pid $PA, host B pid $PB (in its namespace)"
# NCCL's kernel launches each rank counted so far (those a job checkpoint
# holds the ranks at): after as many steps, the two counts are close
syncops() { sed -n 's/.*"sync_ops": *"\([0-9]*\)".*/\1/p'; }
GA=$PA GB=$PB
if [ "$LAUNCH" = torchrun ]; then # the parts are the launchers; their ranks are their children
	GA=$(pgrep -P "$PA" | head -1)
	GB=$(on_b pgrep -P "$PB" | head -1)
fi
note "operations that wait for a peer, counted at step $(steps "$J"): host A $(GPUCR_SOCKET=$SA "$GPUCR" client "$GA" stats --json | syncops), host B $(on_b env GPUCR_SOCKET=$SB "$GPUCR" client "$GB" stats --json | syncops)"
PARTS=(--part "root@host-a=$PA" --part "root@host-b=$PB")
report() { # NAME FILE RC
	local res=ok
	[ "$3" = 0 ] || res="FAILED: $(tail -c 600 "$2" | tr '\n' ' ')"
	note "| $1 | $res | $(jf "$2" seconds) | $(jf "$2" frozen_seconds) | $(jf "$2" quiesced_seconds) | $(jf "$2" sync_count) |"
	[ "$3" = 0 ] || fail=1
}
if [ "$(left)" -gt 120 ]; then
	n0=$(steps "$J")
	timeout 180 "$GPUCR" job checkpoint "${PARTS[@]}" -D "$RUNNING" --leave-running --json "${JOBFLAGS[@]}" >"$LOGS/ckpt-running.json" 2>&1
	report "checkpoint --leave-running" "$LOGS/ckpt-running.json" $?
	wait_steps "$J" $((n0 + 30)) 60 || bad "the job does not run on after the checkpoint --leave-running"
fi
if [ "$(left)" -gt 120 ]; then
	timeout 180 "$GPUCR" job checkpoint "${PARTS[@]}" -D "$IMG" --json "${JOBFLAGS[@]}" >"$LOGS/ckpt.json" 2>&1
	rc=$?
	report "checkpoint (stops)" "$LOGS/ckpt.json" $rc
	n1=$(steps "$J")
	sleep 1
	[ "$(steps "$J")" = "$n1" ] || bad "the job ran on after the stopping checkpoint"
	if [ $rc = 0 ]; then
		pid_gone "$PA" || bad "host A's rank pid $PA is not free"
		timeout 180 "$GPUCR" job restore --part root@host-a --part root@host-b -D "$IMG" --json "${JOBFLAGS[@]}" >"$LOGS/restore.json" 2>&1
		report "restore" "$LOGS/restore.json" $?
		wait_done "$J" "$(left)" || bad "the restored job did not end"
		note "restored at step $n1; the job ended with $(steps "$J") step lines"
	fi
fi
$PY - "$REF" "$J" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
def lines(p):
    out = {}
    for l in open(p):
        f = l.split()
        if f and f[0] == "step":
            out.setdefault(int(f[1]), []).append(l.strip())
    return out
ref, job = lines(sys.argv[1]), lines(sys.argv[2])
same = sum(1 for s, ls in job.items() if s in ref and all(l == ref[s][0] for l in ls))
dup = sum(1 for ls in job.values() if len(ls) > 1)
ok = same == len(job) == len(ref) and dup == 0
print(f"steps: {'EXACT' if ok else 'NOT EXACT'}: {same} of {len(job)} steps equal to the reference's {len(ref)} (steps written twice: {dup})")
PYEOF
grep -q "^steps: EXACT" "$LOGS/summary.txt" || fail=1
note ""
[ $fail = 0 ] && note "RESULT: all checks passed" || note "RESULT: FAILURES above"
exit $fail
