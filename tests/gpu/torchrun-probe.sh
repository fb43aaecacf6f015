#!/usr/bin/env bash
# Which process of a torchrun job holds an io_uring instance, and what made
# it (the launcher tree CRIU must dump), on the GPU machine:
#
#   bash tests/gpu/torchrun-probe.sh [CRIU_BUNDLE]
#
# Runs torchrun --standalone --nproc-per-node 2 with a tiny gloo script, and
# for the agent and each rank lists its io_uring descriptors (and fdinfo),
# then the same for a TCPStore made alone (libuv and not) and for torchrun
# with USE_LIBUV=0 / UV_USE_IO_URING=0 / TORCHELASTIC_USE_AGENT_STORE=False.
# Output on stdout (and $OUT/torchrun-probe.txt).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
PY=${PYTHON:-python3}
# CRIU_BUNDLE (optional, scripts/make-criu-bundle.sh output): also try a
# criu dump of each tree.
CRIU=
if [ -n "${1:-}" ]; then
	LOGS=$(mktemp -d)
	C=$(root_bundle "$1") && CRIU=$C/bin/criu
fi
W=$(mktemp -d)
trap 'pkill -9 -f "$W/" 2>/dev/null; rm -rf "$W"' EXIT
cat >"$W/train.py" <<'PYEOF'
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print("rank", dist.get_rank(), "pid", os.getpid(), flush=True)
for i in range(600):
    t = torch.ones(4) * i
    dist.all_reduce(t)
    time.sleep(0.1)
PYEOF
rings() { # PID LABEL
	local p=$1 n=0 f
	for f in /proc/$p/fd/*; do
		if [ "$(readlink "$f" 2>/dev/null)" = "anon_inode:[io_uring]" ]; then
			n=$((n + 1))
			echo "    $2 pid $p fd ${f##*/}: $(tr '\n' ' ' <"/proc/$p/fdinfo/${f##*/}" | cut -c1-200)"
		fi
	done
	echo "  $2 pid $p ($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-90)): $n io_uring; threads: $(cat /proc/$p/task/*/comm 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')"
}
tree() { # PID LABEL: the process and its descendants
	rings "$1" "$2"
	for c in $(cat /proc/$1/task/*/children 2>/dev/null); do tree "$c" "  $2>"; done
}
probe() { # LABEL TORCHRUN_ARGS... (-- ENV...)
	local label=$1 args=() envs=()
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	envs=("$@")
	echo "== $label"
	env "${envs[@]}" setsid torchrun --standalone --nproc-per-node 2 "${args[@]}" "$W/train.py" >"$W/out.txt" 2>&1 &
	local launcher=$!
	sleep 12
	tree "$launcher" "torchrun"
	if [ -n "${CRIU:-}" ]; then
		# Can CRIU dump the whole tree now (it runs on: -R)?
		rm -rf /dev/shm/trprobe && mkdir -p /dev/shm/trprobe
		if timeout 60 "$CRIU" dump -t "$launcher" -D /dev/shm/trprobe -R --tcp-established --link-remap \
			--network-lock skip -o dump.log >/dev/null 2>&1; then
			echo "  criu dump of the tree: OK ($(du -sm /dev/shm/trprobe | cut -f1) MiB)"
		else
			echo "  criu dump of the tree: FAILED: $(grep -E 'Error|error' /dev/shm/trprobe/dump.log | head -3 | tr '\n' ' ' | cut -c1-300)"
		fi
		rm -rf /dev/shm/trprobe
	fi
	kill -9 -- -"$launcher" 2>/dev/null
	pkill -9 -f "$W/train.py" 2>/dev/null
	sleep 1
}
{
	# Not note_host: this probe writes to stdout (and $OUT), not a summary.
	echo "host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $($PY -c 'import torch; print("torch", torch.__version__)')"
	echo "kernel: $(uname -r); io_uring_disabled=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null)"
	# ONLY_WHO=1 skips the launches below (the stores' makers only).
	[ -z "${ONLY_WHO:-}" ] && {
	probe "torchrun, defaults"
	probe "USE_LIBUV=0" -- USE_LIBUV=0
	probe "UV_USE_IO_URING=0" -- UV_USE_IO_URING=0
	probe "TORCHELASTIC_USE_AGENT_STORE=False" -- TORCHELASTIC_USE_AGENT_STORE=False
	probe "--rdzv-conf use_libuv=False" --rdzv-conf use_libuv=False
	probe "--rdzv-conf use_libuv=False, TORCHELASTIC_USE_AGENT_STORE=False" --rdzv-conf use_libuv=False -- TORCHELASTIC_USE_AGENT_STORE=False
	}
	echo "== who makes the agent's stores and touches CUDA (torchrun_probe.py)"
	setsid timeout 25 $PY tests/gpu/torchrun_probe.py "$W/train.py" --standalone --nproc-per-node 2 >"$W/who.txt" 2>&1 &
	sleep 14
	ag=$(pgrep -f torchrun_probe.py | head -1)
	[ -n "$ag" ] && rings "$ag" "agent (probe)" && echo "    its GPU files: $(ls -l /proc/$ag/fd 2>/dev/null | grep -o '/dev/nvidia[a-z0-9-]*' | sort -u | tr '\n' ' ')"
	sleep 12
	grep -v '^rank\|^\[' "$W/who.txt" | head -80
	echo "== env:// rendezvous as torch.multiprocessing.spawn does it: rank 0's store"
	for uv in "" 0; do
		for r in 0 1; do
			env ${uv:+USE_LIBUV=$uv} MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r setsid $PY "$W/train.py" >"$W/env-$r.txt" 2>&1 &
		done
		sleep 10
		r0=$(grep -o 'pid [0-9]*' "$W/env-0.txt" | head -1 | cut -d' ' -f2)
		[ -n "$r0" ] && rings "$r0" "rank 0 (USE_LIBUV=${uv:-unset})"
		pkill -9 -f "$W/train.py"
		sleep 1
	done
	echo "== a TCPStore alone"
	for lib in True False; do
		$PY - "$lib" <<'PYEOF' &
import os, sys, time
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, 1, True, use_libuv=(sys.argv[1] == "True"))
print("store use_libuv", sys.argv[1], "pid", os.getpid(), flush=True)
time.sleep(6)
PYEOF
		sp=$!
		sleep 4
		rings "$sp" "TCPStore(use_libuv=$lib)"
		wait "$sp"
	done
	echo "== python importing torch.distributed.run only"
	$PY -c "import torch.distributed.run, time, os; print(os.getpid()); time.sleep(5)" &
	sp=$!
	sleep 4
	rings "$sp" "import torch.distributed.run"
	wait "$sp"
	echo "== libuv in torch"
	$PY - <<'PYEOF'
import torch, os, glob, subprocess
d = os.path.join(os.path.dirname(torch.__file__), "lib")
for f in sorted(glob.glob(d + "/*.so*")):
    try:
        out = subprocess.run(["grep", "-c", "io_uring_setup\\|uv__iou", f], capture_output=True, text=True).stdout.strip()
    except Exception as e:
        out = str(e)
    if out not in ("0", ""):
        print(os.path.basename(f), "mentions io_uring:", out)
    s = subprocess.run(["grep", "-ao", "libuv[-/ ]*v\\?1\\.[0-9]*\\.[0-9]*", f], capture_output=True, text=True).stdout.split()
    if s:
        print(os.path.basename(f), "libuv version strings:", sorted(set(s))[:3])
PYEOF
} 2>&1 | tee "${OUT:-/tmp}/torchrun-probe.txt"
