# Shell functions the GPU scripts share; their table goes to
# $LOGS/summary.txt (fresh_logs sets LOGS up, or the script itself). `bad`
# sets fail=1, the scripts' exit status.
#
# A script's preamble, in this order: cd to the repository root, source this
# file, its arguments (prefix_criu_args or prefix_arg), fresh_logs, use_criu,
# then note_host.

# NVLink multicast stays off in NCCL, PyTorch and NVSHMEM on every GPU
# machine: a program that uses it can put the host's GPUs, which others
# share, out of service for a day or more. Exported as this file is sourced,
# so that no script can leave it out; whatever a script starts with an
# environment of its own must be given them again (torch_container_flags
# does for a container).
MULTICAST_OFF=(NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)
export "${MULTICAST_OFF[@]}"
fail=0
note() { printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"; }
# note_host [EXTRA]: the summary's host line: the CPUs, the first GPU's name,
# driver and memory times the number of GPUs, the CRIU that gpucr runs
# (GPUCR_CRIU, which use_criu sets) where there is one, and EXTRA; "; "
# between them.
# shellcheck disable=SC2120 # EXTRA is optional
note_host() {
	local gpu criu=
	gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
	[ -n "$gpu" ] && gpu="$gpu x $(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
	[ -n "${GPUCR_CRIU:-}" ] && criu="; $("$GPUCR_CRIU" --version 2>&1 | head -1)"
	note "host: $(nproc) cores; ${gpu:-no GPU}$criu${1:+; $1}"
}
bad() { note "FAIL: $*"; fail=1; }
now() { date +%s.%N; }
# span T0 T1: the seconds from T0 to T1 ("1.234 s").
span() { python3 -c "print(f'{$2-$1:.3f} s')"; }
# hbs LOG: the heartbeat lines in LOG so far.
hbs() {
	local n
	n=$(grep -c '^hb' "$1" 2>/dev/null)
	echo "${n:-0}"
}
# next_heartbeat LOG N: the time LOG first holds more than N heartbeats
# (polled every 10 ms for up to 30 s); nothing if it never does.
next_heartbeat() {
	for _ in $(seq 3000); do
		if [ "$(hbs "$1")" -gt "$2" ]; then
			now
			return
		fi
		sleep 0.01
	done
}
# checksum_advancing LOG: "yes" if the last heartbeat's checksum (work.py's
# fourth field) changes within a second, else "no".
checksum_advancing() {
	local c1 c2
	c1=$(grep '^hb' "$1" | tail -1 | awk '{print $4}')
	sleep 1
	c2=$(grep '^hb' "$1" | tail -1 | awk '{print $4}')
	if [ -n "$c1" ] && [ "$c1" != "$c2" ]; then echo yes; else echo no; fi
}
# pcie_floor: the PCIe floor of this run, pinned 4 GiB copies with PyTorch,
# best of 3, into DTOH and HTOD (GB/s); the log in $LOGS/pcie.txt.
pcie_floor() {
	${PY:-python3} - >"$LOGS/pcie.txt" 2>&1 <<'PYEOF'
import time, torch
n = 4 << 30
d = torch.empty(n, dtype=torch.uint8, device="cuda")
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
def rate(f):
    f(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter(); f(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
    return n / best / 1e9
print(f"{rate(lambda: h.copy_(d, non_blocking=True)):.2f} {rate(lambda: d.copy_(h, non_blocking=True)):.2f}")
PYEOF
	read -r DTOH HTOD < <(tail -1 "$LOGS/pcie.txt")
}
# root_bundle DIR: a copy of DIR (a carried CRIU bundle) where root alone can
# change it, /opt/gpucr-carried/NAME, and its path. gpucr run as root takes a
# CRIU that the environment names (PATH, GPUCR_CRIU) only from such a place
# (docs/security.md), and the carried working tree may lie below a directory
# of another user.
root_bundle() {
	local d
	d=/opt/gpucr-carried/$(basename "$1")
	rm -rf "$d" && mkdir -p /opt/gpucr-carried && chmod 755 /opt/gpucr-carried &&
		cp -a "$1" "$d" && chown -R root:root "$d" && chmod -R go-w "$d" && echo "$d"
}
# start_helper GPUCR SOCK LOG [FLAGS...]: `GPUCR helper --socket SOCK FLAGS`
# in the background, its output appended to LOG, its pid in HELPER; returns
# once it answers `gpucr status` (1 if it has not within 10 s).
start_helper() {
	local g=$1 sock=$2 log=$3
	shift 3
	mkdir -p "$(dirname "$sock")"
	"$g" helper --socket "$sock" "$@" >>"$log" 2>&1 &
	HELPER=$!
	for _ in $(seq 100); do
		"$g" status --socket "$sock" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}
# pid_gone PID: waits up to 20 s until PID is free (its zombie reaped); 1 if
# it is not.
pid_gone() {
	for _ in $(seq 400); do
		[ -e "/proc/$1" ] || return 0
		sleep 0.05
	done
	return 1
}
# jf FILE KEY...: a field of the last JSON line of FILE (a --json report);
# nothing if it has none.
jf() { ${PY:-python3} -c "
import json,sys
r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for k in sys.argv[2:]:
    r = r.get(k, {}) if isinstance(r, dict) else {}
print(r if r != {} else '')" "$@" 2>/dev/null; }
# restore_after_kill GPUCR SOCK DIR LOG PID PATTERN NAME [FIELD]: the original run
# (PID, heartbeats in LOG) goes on for 3 more heartbeats, past the image in
# DIR; every process matching PATTERN is killed; DIR is restored, runs 4
# heartbeats and is killed; then one line "NAME: restored exactly|NOT
# EXACTLY ..." goes to the summary: every heartbeat of the restored run that
# the original also reached (at least 2) must be the original's (the test
# applications' "hb ITER SUM TIME"; FIELD, default 2, is the field of the
# sum: stall_job.py's "hb ITER TIME SUM" has it in 3). fail=1 if not.
restore_after_kill() {
	local g=$1 sock=$2 dir=$3 log=$4 pid=$5 pattern=$6 name=$7 field=${8:-2} h1 mark
	h1=$(hbs "$log")
	for _ in $(seq 600); do [ "$(hbs "$log")" -ge $((h1 + 3)) ] && break; sleep 0.05; done
	pkill -9 -f "$pattern"
	pid_gone "$pid"
	mark=$(hbs "$log")
	if "$g" restore -D "$dir" --socket "$sock" --json >"$LOGS/$name-restore.json" 2>&1; then
		for _ in $(seq 600); do [ "$(hbs "$log")" -ge $((mark + 4)) ] && break; sleep 0.05; done
	else
		bad "$name restore: $(tail -n 3 "$LOGS/$name-restore.json")"
	fi
	pkill -9 -f "$pattern"
	python3 - "$log" "$mark" "$name" "$field" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
hb = [l.split() for l in open(sys.argv[1]) if l.startswith("hb ")]
mark, name, f = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ref = {}
for h in hb[:mark]:
    ref.setdefault(h[1], h[f])
after = hb[mark:]
both = [h for h in after if h[1] in ref]
same = sum(1 for h in both if ref[h[1]] == h[f])
ok = len(both) >= 2 and same == len(both)
print(f"{name}: restored {'exactly' if ok else 'NOT EXACTLY'}: from iteration {after[0][1] if after else '-'}, "
      f"{same} of the {len(both)} heartbeats the original run also reached are equal to its")
PYEOF
	grep -q "^$name: restored exactly" "$LOGS/summary.txt" || fail=1
}
# gpu_apps: the test applications and drvtest built against the real driver
# (build/gpu/bin; make rebuilds only what changed); 1, and a FAIL line, if
# the build fails.
gpu_apps() {
	make -s gpu-apps >"$LOGS/gpu-apps.txt" 2>&1 && return 0
	bad "make gpu-apps: $(tail -n 3 "$LOGS/gpu-apps.txt")"
	return 1
}
# prefix_criu_args USAGE ARG...: a script's arguments GPUCR_PREFIX
# CRIU_BUNDLE (its first two; the rest are the script's own) into G (the
# prefix made absolute, from where the script runs), GPUCR ($G/bin/gpucr) and
# C (the bundle, as given: use_criu copies it). Called as a plain statement,
# not in $(...), so that a missing or empty argument, or a prefix that is no
# directory, ends the script itself: USAGE on stderr, status 2 (a call to
# mend, apart from the 1 of a test that failed).
# shellcheck disable=SC2034 # C is the calling script's
prefix_criu_args() {
	local usage=$1
	shift
	[ -n "${2:-}" ] || { echo "$usage" >&2; exit 2; }
	prefix_arg "$usage" "$@"
	C=$2
}
# prefix_arg USAGE ARG...: prefix_criu_args for a script with no CRIU
# bundle: GPUCR_PREFIX, its first argument, into G and GPUCR alone.
# shellcheck disable=SC2034 # GPUCR is the calling script's
prefix_arg() {
	G=${2:-}
	abs_dir "$1" G
	GPUCR=$G/bin/gpucr
}
# abs_dir USAGE VAR: the directory VAR names, made absolute (from where the
# script runs), into VAR. As prefix_arg, a plain statement: empty, or no
# directory, ends the script with USAGE on stderr, status 2.
abs_dir() {
	local d
	if [ -z "${!2:-}" ] || ! d=$(cd "${!2}" && pwd); then
		echo "$1" >&2
		exit 2
	fi
	printf -v "$2" %s "$d"
}
# fresh_logs DIR: LOGS is $LOGS if set, else DIR; made empty and absolute,
# with an empty summary.txt.
fresh_logs() {
	LOGS=${LOGS:-$1}
	rm -rf "$LOGS" && mkdir -p "$LOGS"
	LOGS=$(cd "$LOGS" && pwd)
	: >"$LOGS/summary.txt"
}
# use_criu BUNDLE: the carried CRIU bundle, copied where root alone can
# change it (root_bundle), is the CRIU gpucr runs (GPUCR_CRIU); 1 if not.
use_criu() {
	local c
	c=$(root_bundle "$1") || return 1
	export GPUCR_CRIU=$c/bin/criu
}
# torch_container_flags: into the array extra, the scripts/oci-bundle.sh flags
# a container running PyTorch on the GPU needs beyond the host's /usr: binds
# of Python and torch where they live outside /usr (a venv, conda), the
# NVIDIA device nodes, and NVLink multicast off (MULTICAST_OFF: the
# container's environment is its spec's, not this shell's).
torch_container_flags() {
	local p d e
	extra=()
	for e in "${MULTICAST_OFF[@]}"; do
		extra+=(-e "$e")
	done
	for p in $(python3 -c 'import sys, os, torch; print(sys.prefix); print(sys.base_prefix); print(os.path.dirname(os.path.dirname(torch.__file__)))'); do
		case $p in /usr | /usr/*) ;; *) extra+=(-w "$p:$p") ;; esac
	done
	for d in /dev/nvidia*; do
		[ -c "$d" ] && extra+=(-d "$d")
	done
}
