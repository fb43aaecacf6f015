#!/usr/bin/env bash
# Restore onto another GPU, on a machine with two GPUs of one kind:
#
#   bash tests/gpu/other-gpu.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]
#
#   1. drvtest ckpt_restore_gpu_pairs against the driver: a restore onto
#      device 1 finds its memory, and what the driver answers to pairs that
#      name a GPU that is not there, leave the process's GPU out, or swap
#      both GPUs (printed; the simulator is built to answer the same).
#   2. heartbeat (the C test application, --show-device) under gpucr on GPU
#      0, dumped, restored with --device-map 0=1: every heartbeat after the
#      restore equal to the original run's, and the GPU behind its ordinal
#      now GPU 1.
#   3. PyTorch: stall_job.py --train-small (a transformer with AdamW and
#      DataLoader workers) on GPU 0, dumped, then restored three ways, each
#      from its own copy of the image: onto the same GPU, with --device-map
#      0=1, and (BASE_PREFIX, an earlier build) onto the same GPU. The time
#      from the restore's start to the job's next step, whether the losses
#      after it equal an uninterrupted run's, and what the restored process
#      finds of its device (torch's cached uuid, the driver's UUID and bus id
#      for ordinal 0, NVML's UUID for that bus id).
#
# PARTS (default "driver heartbeat torch") picks the sections; "torch-other"
# runs only the PyTorch restore onto the other GPU. OTHER_FLAGS adds flags
# to the restores onto GPU 1 (OTHER_FLAGS=--on-demand). Images in /dev/shm; logs
# in build/gpu/other-gpu (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: other-gpu.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]" "$@"
BASE=${3:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
PY=${PYTHON:-python3}
JOB=$(pwd)/tests/gpu/stall_job.py
fresh_logs build/gpu/other-gpu
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-other-gpu
SOCK=/run/gpucr-other-gpu/helper.sock
trap 'pkill -9 -f "$JOB" 2>/dev/null; pkill -9 -f "build/gpu/bin/heartbeat" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
# Not note_host: the restore onto the other GPU is about which GPU is which,
# so this host line names each one (index, UUID, bus id).
note "host: $(nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version --format=csv,noheader | tr '\n' ';')"
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { bad "this machine has fewer than two GPUs"; exit 1; }
UUID0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
UUID1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1)
gpu_apps || exit 1

PARTS=${PARTS:-driver heartbeat torch}
# OTHER_FLAGS: more flags for the restores onto GPU 1 (say --on-demand)
OTHER_FLAGS=${OTHER_FLAGS:-}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# 1. the driver
if part driver; then
timeout 300 build/gpu/bin/drvtest ckpt_restore_gpu_pairs >"$LOGS/drvtest.txt" 2>&1
note "drvtest: $(grep -E '^(ok|FAIL)' "$LOGS/drvtest.txt" | head -1)"
grep '^#' "$LOGS/drvtest.txt" | while read -r l; do note "  driver $l"; done
grep -q '^ok ckpt_restore_gpu_pairs' "$LOGS/drvtest.txt" || { bad "drvtest ckpt_restore_gpu_pairs"; cat "$LOGS/drvtest.txt" | tail -n 8 >>"$LOGS/summary.txt"; }
fi

# 2. heartbeat
if part heartbeat; then
rm -rf "$IMG" && mkdir -p "$IMG"
start_helper "$G/bin/gpucr" "$SOCK" "$LOGS/helper.log" || { bad "helper"; exit 1; }
HBL=$LOGS/heartbeat.log
setsid "$G/bin/gpucr" run --socket "$SOCK" -- build/gpu/bin/heartbeat --mib 256 --hb-every 1 --interval-ms 20 --show-device \
	</dev/null >"$HBL" 2>&1 &
for _ in $(seq 600); do [ "$(hbs "$HBL")" -ge 20 ] && break; sleep 0.05; done
P=$(grep -o 'pid=[0-9]*' "$HBL" | head -1 | cut -d= -f2)
if [ -z "$P" ]; then
	bad "heartbeat did not start: $(tail -n 3 "$HBL")"
else
	if "$G/bin/gpucr" checkpoint "$P" -D "$IMG/hb" --socket "$SOCK" >"$LOGS/hb-dump.txt" 2>&1; then
		pid_gone "$P"
		mark=$(hbs "$HBL")
		t0=$(now)
		if "$G/bin/gpucr" restore -D "$IMG/hb" --socket "$SOCK" --device-map 0=1 $OTHER_FLAGS --json >"$LOGS/hb-restore.json" 2>&1; then
			t1=$(next_heartbeat "$HBL" "$mark")
			for _ in $(seq 600); do [ "$(hbs "$HBL")" -ge $((mark + 20)) ] && break; sleep 0.05; done
			note "heartbeat 256 MiB: restore with --device-map 0=1 $OTHER_FLAGS to its next heartbeat $(span "$t0" "${t1:-$t0}")"
		else
			bad "heartbeat restore --device-map 0=1: $(tail -n 3 "$LOGS/hb-restore.json")"
		fi
		kill -9 "$P" 2>/dev/null
		last=$(grep '^hb' "$HBL" | tail -1)
		after=$(grep '^hb' "$HBL" | tail -n +$((mark + 1)) | head -1 | awk '{print $2}')
		n=$(grep '^hb' "$HBL" | tail -1 | awk '{print $2}')
		build/gpu/bin/heartbeat --mib 256 --hb-every 1 --interval-ms 0 --iters "$n" >"$LOGS/heartbeat-ref.log" 2>&1
		$PY - "$HBL" "$LOGS/heartbeat-ref.log" "$mark" "$UUID1" "$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 1)" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
hb = [l.split() for l in open(sys.argv[1]) if l.startswith("hb ")]
ref = {l.split()[1]: l.split()[2] for l in open(sys.argv[2]) if l.startswith("hb ")}
mark, want, bus = int(sys.argv[3]), sys.argv[4], sys.argv[5].lower()
after = hb[mark:]
same = sum(1 for h in hb if ref.get(h[1]) == h[2])
gpus = sorted({" ".join(h[4:6]) for h in after if len(h) > 5})
# the bus ids' domains are written with 8 digits by nvidia-smi, 4 by the driver
ok = (len(after) >= 2 and same == len(hb) and len(gpus) == 1 and gpus[0].startswith("gpu=" + want + " bus=")
      and gpus[0].lower().endswith(bus[-7:]))
print(f"heartbeat onto GPU 1: {'OK' if ok else 'WRONG'}: {same} of {len(hb)} heartbeats equal to an uninterrupted run's "
      f"({len(after)} after the restore, from iteration {after[0][1] if after else '-'}); GPU after the restore: {gpus}")
PYEOF
		grep -q "^heartbeat onto GPU 1: OK" "$LOGS/summary.txt" || fail=1
		note "  last heartbeat: $last (nvidia-smi: GPU 1 is $UUID1)"
	else
		bad "heartbeat dump: $(tail -n 3 "$LOGS/hb-dump.txt")"
	fi
fi
kill $HELPER 2>/dev/null
wait $HELPER 2>/dev/null
fi

# 3. PyTorch
if part torch || part torch-other; then
REF=$LOGS/torch-ref.log
setsid $PY "$JOB" 0 "$REF" --train-small </dev/null >"$LOGS/torch-ref.out" 2>&1 &
RP=$!
for _ in $(seq 1800); do grep -q '^hb 150 ' "$REF" 2>/dev/null && break; sleep 0.1; done
kill -9 $RP 2>/dev/null
pkill -9 -f "$REF"

# jobs_gone: waits up to 20 s until no process of the job is left (its
# DataLoader workers included: CRIU needs their pids back).
jobs_gone() {
	for _ in $(seq 400); do
		pgrep -f "$JOB" >/dev/null || return 0
		sleep 0.05
	done
	return 1
}

restore_torch() { # NAME GPUCR DIR MAP...
	local name=$1 g=$2 dir=$3
	shift 3
	local L=$LOGS/torch.log mark n t0 t1
	pkill -9 -f "$JOB"
	jobs_gone
	# CRIU restores an open file only as it was at the dump
	cp "$LOGS/torch.log.at-dump" "$L"
	cp "$LOGS/torch.out.at-dump" "$LOGS/torch.out"
	mark=$(hbs "$L")
	n=$(grep -c '^st' "$L")
	t0=$(now)
	if "$g" restore -D "$dir" --socket "$SOCK" "$@" --json >"$LOGS/torch-$name-restore.json" 2>&1; then
		for _ in $(seq 2000); do [ "$(grep -c '^st' "$L")" -gt "$n" ] && break; sleep 0.005; done
		t1=$(now)
		for _ in $(seq 600); do [ "$(hbs "$L")" -ge $((mark + 6)) ] && break; sleep 0.05; done
		pkill -9 -f "$JOB"
		$PY - "$L" "$REF" "$mark" "$name" "$(span "$t0" "$t1")" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
hb = [l.split() for l in open(sys.argv[1]) if l.startswith("hb ")]
ref = {l.split()[1]: l.split()[3] for l in open(sys.argv[2]) if l.startswith("hb ")}
mark, name, took = int(sys.argv[3]), sys.argv[4], sys.argv[5]
after = hb[mark:]
both = [h for h in after if h[1] in ref]
same = sum(1 for h in both if ref[h[1]] == h[3])
ok = len(both) >= 2 and same == len(both)
dev = " ".join(after[-1][4:]) if after else ""
print(f"torch {name}: restore to the next step {took}; losses {'EQUAL' if ok else 'DIFFER'}: {same} of {len(both)} "
      f"heartbeats after the restore equal to an uninterrupted run's; device then: {dev}")
PYEOF
		grep -q "^torch $name: .*losses EQUAL" "$LOGS/summary.txt" || fail=1
		cp "$L" "$LOGS/torch-$name.log"
	else
		bad "torch $name restore: $(tail -n 3 "$LOGS/torch-$name-restore.json")"
	fi
}

rm -rf "$IMG" && mkdir -p "$IMG"
start_helper "$G/bin/gpucr" "$SOCK" "$LOGS/helper.log" || { bad "helper"; exit 1; }
L=$LOGS/torch.log
setsid "$G/bin/gpucr" run --socket "$SOCK" -- $PY "$JOB" 0 "$L" --train-small --show-device </dev/null >"$LOGS/torch.out" 2>&1 &
for _ in $(seq 1800); do grep -q '^hb 40 ' "$L" 2>/dev/null && break; sleep 0.1; done
P=$(grep -o 'pid=[0-9]*' "$L" 2>/dev/null | head -1 | cut -d= -f2)
note "torch before the dump: $(grep '^hb' "$L" | tail -1 | cut -d' ' -f5-)"
if [ -z "$P" ] || ! "$G/bin/gpucr" checkpoint "$P" -D "$IMG/t" --socket "$SOCK" --json >"$LOGS/torch-dump.json" 2>&1; then
	bad "torch job dump: $(tail -n 3 "$LOGS/torch-dump.json" "$LOGS/torch.out" 2>/dev/null)"
else
	pid_gone "$P"
	jobs_gone
	cp "$L" "$LOGS/torch.log.at-dump"
	cp "$LOGS/torch.out" "$LOGS/torch.out.at-dump"
	cp -a "$IMG/t" "$IMG/t-other"
	[ -n "$BASE" ] && cp -a "$IMG/t" "$IMG/t-base"
	if part torch; then
		restore_torch same-gpu "$G/bin/gpucr" "$IMG/t"
		pid_gone "$P"
	fi
	restore_torch other-gpu "$G/bin/gpucr" "$IMG/t-other" --device-map 0=1 $OTHER_FLAGS
	pid_gone "$P"
	if [ -n "$BASE" ] && part torch; then
		kill $HELPER 2>/dev/null
		wait $HELPER 2>/dev/null
		start_helper "$BASE/bin/gpucr" "$SOCK" "$LOGS/base-helper.log" || bad "base helper"
		restore_torch base-same-gpu "$BASE/bin/gpucr" "$IMG/t-base"
	fi
fi
fi
note "nvidia-smi: GPU 0 $UUID0 $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0), GPU 1 $UUID1 $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 1)"
exit $fail
