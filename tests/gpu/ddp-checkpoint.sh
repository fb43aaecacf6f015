#!/usr/bin/env bash
# Checkpoint and restore of jobs whose processes share GPU memory as NCCL's
# ranks do, on a 2-GPU machine (nvidia-h100-x2 or nvidia-h200-x2), or with
# NPROC=4 on a 4-GPU one:
#
#   bash tests/gpu/ddp-checkpoint.sh GPUCR_PREFIX CRIU_BUNDLE
#
# PARTS (default "peer ddp size") picks the sections (steps is extra):
#   peer  peerapp (NPROC ranks on as many GPUs exchanging exported cuMem fds, peer
#         mappings, host-NUMA cuMem flags and stream waits on them) under
#         `gpucr run`: dumped with --leave-running (it must run on to its end
#         exactly), then its image restored after it ended (from the image's
#         iteration to the end, exactly): checksums equal to a plain run's.
#   ddp   tests/gpu/ddp.py (NPROC ranks, NCCL with its defaults: P2P
#         over NVLink, cuMem buffers; 2 DataLoader workers per rank) plain for
#         the reference, then under `gpucr run` twice: a dump of the whole
#         job (its launcher and everything below it) with --leave-running,
#         and one that stops it; each image restored right after the job is
#         gone (gpucr restore ends the closed connections' TIME_WAIT), the
#         stopped job's a second time onto swapped GPUs, where each rank's
#         view of its GPU (DDP_WHERE) and nvidia-smi's are noted. The losses and
#         gradient norms of every step must equal the reference's, in the job
#         that ran on and in each restored job. LAUNCH=gpucr-torchrun: the
#         script started by `gpucr torchrun --standalone --nproc-per-node
#         NPROC`, unchanged (the reference run: torchrun's). LAUNCH=spawn (default: the
#         script spawns its ranks, rank 0 hosts the store) or torchrun
#         (torchrun's agent holds an io_uring instance, which CRIU cannot
#         dump: measured with torch 2.11, whatever USE_LIBUV,
#         UV_USE_IO_URING or --rdzv-conf use_libuv=0 said).
#   steps ROUNDS (default 3) interleaved pairs of DDP runs of TSTEPS (default
#         300) steps without delay, plain and under `gpucr run`: each run's
#         median step time (steps 50 on), the medians over the rounds and
#         their ratio; the losses of each pair must be identical.
#   size  SIZE_ROUNDS (default 3) interleaved rounds of the stop-the-world
#         dump and the restore (to the next heartbeat) of peerapp with
#         SIZE_MIB per rank on each GPU against heartbeat with the same
#         per-process size on one GPU (SIZE_MIB, default 8192: each rank
#         holds 2x that); the medians and their ratios.
# DDP_GRAPH=1 (ddp.py's): each step also replays an all_reduce captured in a
# CUDA graph; each GPU process's count of peer sync operations is noted.
# NOFLAGS=1: the ddp part's checkpoint and restore get no CRIU flags (the
# build chooses them); each dump's stop is broken down either way.
# NPROC (default 2) sets the DDP job's ranks (4 on a 4-GPU machine).
# NCCL_NVLS_ENABLE=0 and the other multicast switches are set throughout
# (lib.sh).
# Logs in build/gpu/ddp-ckpt, or LOGS (and $OUT/NAME-logs.tgz, NAME the
# logs' directory); summary.txt
# holds the table.
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: ddp-checkpoint.sh GPUCR_PREFIX CRIU_BUNDLE" "$@"
PY=${PYTHON:-python3}
STEPS=${STEPS:-160}
LAUNCH=${LAUNCH:-spawn}
NPROC=${NPROC:-2} # DDP ranks, one per GPU (4 on a 4-GPU machine)
MODES=${MODES:-leave stop} # the DDP dumps to take: leave (--leave-running) and stop
SWAP=${SWAP:-1}            # 0: no restore of the stopped job onto swapped GPUs
SIZE_MIB=${SIZE_MIB:-8192}
PARTS=${PARTS:-peer ddp size}  # and steps
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
fresh_logs build/gpu/ddp-ckpt
use_criu "$C" || exit 1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
# torchrun's rendezvous store runs on libuv, which uses io_uring, which CRIU
# cannot checkpoint (gpucr checkpoint says so): without it.
export UV_USE_IO_URING=0 USE_LIBUV=0
# IMG_DIR: where the images go (a tmpfs mounted huge=always takes new chunk
# files about twice as fast as /dev/shm's 4 KiB pages: tests/gpu/README.md)
IMG=${IMG_DIR:-/dev/shm}/gpucr-ddp-ckpt
SOCK=/run/gpucr-ddp-ckpt/helper.sock
BIN=build/gpu/bin
HELPER=
finish() {
	pkill -9 -f tests/gpu/ddp.py 2>/dev/null
	pkill -9 -f "$BIN/peerapp" 2>/dev/null
	pkill -9 -f "$BIN/heartbeat" 2>/dev/null
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null
	rm -rf "$IMG"
	[ -n "${OUT:-}" ] && tar -czf "$OUT/$(basename "$LOGS")-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
}
trap finish EXIT
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
note "## processes sharing GPU memory: checkpoint and restore as one"
note_host "$($PY -c 'import torch; print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)"
if [ "$ngpu" -lt 2 ] || [ "$ngpu" -lt "$NPROC" ]; then
	note "SKIP: $ngpu GPU (needs 2, and NPROC=$NPROC)"
	exit 0
fi
gpu_apps || exit 1
# the GPUs reversed, for the restores onto swapped GPUs: rank r onto GPU NPROC-1-r
swap=$(seq 0 $((NPROC - 1)) | awk -v n="$NPROC" '{printf "%s%d=%d", (NR > 1 ? "," : ""), $1, n - 1 - $1}')
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level debug || {
	bad "the helper did not answer"
	exit 1
}

# secs JSONFILE KEY...: a number from a --json report (the last JSON object in the file).
secs() {
	$PY -c '
import json, sys
t = open(sys.argv[1]).read()
r = json.loads(t[t.rindex("\n{") + 1:] if "\n{" in t else t)
for k in sys.argv[2:]:
    r = r.get(k) or {}
print(f"{r:.3f}" if isinstance(r, (int, float)) else "-")' "$@" 2>/dev/null || echo -
}
# hbsum LOG: "hb ITER SUM" lines.
hbsum() { awk '$1 == "hb" {print $2, $3}' "$1"; }
# same_hbs REF LOG FROMLINE NAME: the heartbeats of LOG from line FROMLINE on
# must all be in REF with the same checksum (at least 2).
same_hbs() {
	$PY - "$1" "$2" "$3" "$4" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
ref = dict(l.split()[1:3] for l in open(sys.argv[1]) if l.startswith("hb "))
hb = [l.split() for l in open(sys.argv[2]) if l.startswith("hb ")][int(sys.argv[3]):]
same = sum(1 for h in hb if ref.get(h[1]) == h[2])
ok = len(hb) >= 2 and same == len(hb)
print(f"{sys.argv[4]}: {'EXACT' if ok else 'NOT EXACT'}: {same} of {len(hb)} heartbeats equal to the plain run's"
      f" (iterations {hb[0][1] if hb else '-'}..{hb[-1][1] if hb else '-'})")
PYEOF
	tail -1 "$LOGS/summary.txt" | grep -q ': EXACT:' || fail=1
}

if part peer; then
	note "### peerapp: $NPROC ranks, one per GPU, sharing memory as NCCL does"
	ARGS=(--iters 4000 --hb-every 100 --interval-ms 2 --mib 256 --ranks "$NPROC")
	timeout 300 "$BIN/peerapp" "${ARGS[@]}" >"$LOGS/peer.plain" 2>&1 || bad "peerapp plain: $(tail -2 "$LOGS/peer.plain")"
	rm -rf "$IMG" && mkdir -p "$IMG"
	# every output appended to (>>): CRIU restores such a file whatever it has grown to
	setsid "$GPUCR" run --socket "$SOCK" -- "$BIN/peerapp" "${ARGS[@]}" </dev/null >>"$LOGS/peer.gpucr" 2>&1 &
	PP=$!
	for _ in $(seq 600); do [ "$(hbs "$LOGS/peer.gpucr")" -ge 5 ] && break; sleep 0.1; done
	"$GPUCR" status --socket "$SOCK" >"$LOGS/peer.status" 2>&1
	sed 's/^/    /' "$LOGS/peer.status" | head -12 | tee -a "$LOGS/summary.txt" >/dev/null
	timeout 300 "$GPUCR" checkpoint "$PP" -D "$IMG" --leave-running --socket "$SOCK" --json >"$LOGS/peer-dump.json" 2>&1 ||
		bad "peerapp dump: $(grep -v '^ *(' "$LOGS/peer-dump.json" | tail -3 | tr '\n' ' ')"
	note "peerapp dump (--leave-running): $(secs "$LOGS/peer-dump.json" seconds) s, stopped $(secs "$LOGS/peer-dump.json" stall_seconds) s"
	for _ in $(seq 1200); do [ -e "/proc/$PP" ] || break; sleep 0.1; done
	kill -9 "$PP" 2>/dev/null
	same_hbs "$LOGS/peer.plain" "$LOGS/peer.gpucr" 0 "peerapp ran on after its dump"
	pid_gone "$PP"
	# restored as it was, then with the GPUs swapped (rank 0 onto GPU 1, rank 1 onto GPU 0)
	for how in same swapped; do
		flags=()
		[ $how = swapped ] && flags=(--device-map "$swap")
		mark=$(hbs "$LOGS/peer.gpucr")
		lines=$(wc -l <"$LOGS/peer.gpucr")
		t0=$(now)
		if timeout 300 "$GPUCR" restore -D "$IMG" "${flags[@]}" --socket "$SOCK" --json >"$LOGS/peer-restore-$how.json" 2>&1; then
			for _ in $(seq 1200); do tail -n +"$((lines + 1))" "$LOGS/peer.gpucr" | grep -q '^done' && break; sleep 0.1; done
			note "peerapp restore ($how GPUs): GPU launches after $(secs "$LOGS/peer-restore-$how.json" ready gpu_launch_seconds) s; ran to its end after $(span "$t0" "$(now)")"
			same_hbs "$LOGS/peer.plain" "$LOGS/peer.gpucr" "$mark" "peerapp restored ($how GPUs)"
			tail -n +"$((lines + 1))" "$LOGS/peer.gpucr" | grep -v '^hb\|^done' | head -3 | sed 's/^/    /' | tee -a "$LOGS/summary.txt" >/dev/null
		else
			bad "peerapp restore ($how GPUs): $(grep -v '^ *(' "$LOGS/peer-restore-$how.json" | tail -3 | tr '\n' ' ')"
		fi
		pkill -9 -f "$BIN/peerapp" 2>/dev/null
		for _ in $(seq 100); do pgrep -f "$BIN/peerapp" >/dev/null || break; sleep 0.1; done
	done
	pkill -9 -f "$BIN/peerapp" 2>/dev/null
fi

# ddp_cmd OUTFILE: the job's command line, into the array cmd.
ddp_cmd() {
	if [ "$LAUNCH" = gpucr-torchrun ]; then
		# the script as torchrun runs it, unchanged: gpucr torchrun puts each rank under gpucr itself
		cmd=("$GPUCR" torchrun --socket "$SOCK" --standalone --nproc-per-node "$NPROC" tests/gpu/ddp.py "$1" "$STEPS")
	elif [ "$LAUNCH" = torchrun ]; then
		cmd=(torchrun --standalone --rdzv-conf use_libuv=0 --nproc-per-node "$NPROC" tests/gpu/ddp.py "$1" "$STEPS")
	else
		cmd=(env DDP_SPAWN="$NPROC" "$PY" tests/gpu/ddp.py "$1" "$STEPS")
	fi
}
# ddp_start NAME: the job under gpucr run, its steps to $LOGS/NAME.txt; its
# launcher's pid in JOB once rank 0 has written 20 steps.
ddp_start() {
	rm -f "$LOGS/$1.txt" "$LOGS/$1.txt.where" "$LOGS/$1.out"
	ddp_cmd "$LOGS/$1.txt"
	if [ "$LAUNCH" = gpucr-torchrun ]; then
		setsid "${cmd[@]}" </dev/null >>"$LOGS/$1.out" 2>&1 &
	else
		setsid "$GPUCR" run --socket "$SOCK" -- "${cmd[@]}" </dev/null >>"$LOGS/$1.out" 2>&1 &
	fi
	JOB=$!
	SID=$JOB # setsid: the job's session
	for _ in $(seq 1800); do
		n=$(grep -c '^step' "$LOGS/$1.txt" 2>/dev/null)
		if [ "${n:-0}" -ge 20 ]; then
			local p u
			u=
			for p in $(pgrep -s "$(ps -o sid= -p "$JOB" | tr -d ' ')"); do
				ls -l /proc/"$p"/fd 2>/dev/null | grep -q io_uring && u="$u $p($(tr '\0' ' ' </proc/"$p"/cmdline | cut -c1-60))"
			done
			[ -n "$u" ] && note "$1: io_uring held by:$u"
			return 0
		fi
		sleep 0.1
	done
	bad "$1: the job did not reach step 20: $(tail -3 "$LOGS/$1.out" | tr '\n' ' ')"
	return 1
}
# same_steps NAME FROMLINE WHAT: the step lines of NAME.txt from line
# FROMLINE on must be the reference's lines of the same steps (at least 5).
same_steps() {
	$PY - "$LOGS/ddp.plain.txt" "$LOGS/$1.txt" "$2" "$3" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import sys
ref = {l.split()[1]: l for l in open(sys.argv[1]).read().splitlines() if l.startswith("step ")}
lines = open(sys.argv[2]).read().splitlines()[int(sys.argv[3]):]
st = [l for l in lines if l.startswith("step ")]
same = sum(1 for l in st if ref.get(l.split()[1]) == l)
ok = len(st) >= 5 and same == len(st)
print(f"{sys.argv[4]}: {'IDENTICAL' if ok else 'NOT IDENTICAL'}: {same} of {len(st)} steps' loss and gradient norm"
      f" equal to the plain run's (steps {st[0].split()[1] if st else '-'}..{st[-1].split()[1] if st else '-'}"
      f"{', done' if 'done' in lines else ''})")
PYEOF
	tail -1 "$LOGS/summary.txt" | grep -q ': IDENTICAL:' || fail=1
}
# session_gone: until no process (zombies included: pid 1 reaps slowly here)
# is left of the job's session SID, whose ids a restore needs back.
session_gone() {
	for _ in $(seq 300); do
		[ "$(ps -e -o sid= | awk -v s="$SID" '$1 == s' | wc -l)" = 0 ] && return 0
		sleep 0.1
	done
	note "the job's session $SID still has processes: $(ps -e -o sid=,pid=,stat=,comm= | awk -v s="$SID" '$1 == s' | head -5 | tr '\n' ';')"
}
# time_waits: the host's TCP connections in TIME_WAIT (state 06 of /proc/net/tcp*).
time_waits() { awk '$4 == "06"' /proc/net/tcp /proc/net/tcp6 2>/dev/null | wc -l; }
# bind_conflicts CRIULOG: for each listening socket CRIU could not bind
# again, what of the host holds its port now (/proc/net/tcp*: local
# address, remote address, state in hex).
bind_conflicts() {
	$PY - "$1" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import re, sys
last, ports = {}, []
for l in open(sys.argv[1], errors="replace"):
    m = re.search(r"\s(\d+): inet: \tRestore: .* port (\d+) state (\S+)", l)
    if m:
        last[m.group(1)] = (int(m.group(2)), m.group(3))
    m = re.search(r"\s(\d+): Error .*Can't bind inet socket", l)
    if m and m.group(1) in last:
        ports.append(last[m.group(1)])
for port, st in ports:
    held = []
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in open(f).read().splitlines()[1:]:
            c = row.split()
            if int(c[1].split(":")[1], 16) == port:
                held.append(f"{c[1]} {c[2]} st {c[3]}")
    print(f"    port {port} ({st}) could not be bound again; now held by: {held or 'nothing'}")
PYEOF
}
# The restore's flags (NOFLAGS=1: none; the image's record says).
rflags=(--tcp-established --criu-opt 'network-lock skip')
[ "${NOFLAGS:-}" = 1 ] && rflags=()
# stop_breakdown DUMPJSON: where a dump's stop went: CRIU's account (freezing,
# frozen, collecting and writing the tree's memory, pages) and each GPU
# process's steps in the helper (the driver's checkpoint among them).
stop_breakdown() {
	$PY - "$1" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, sys
t = open(sys.argv[1]).read()
r = json.loads(t[t.rindex("\n{") + 1:] if "\n{" in t else t)
c = r.get("criu") or {}
ph = {p["name"]: p["seconds"] for p in r.get("phases") or []}
print(f"    stop: criu-dump {ph.get('criu-dump', 0):.3f} s; CRIU: freezing {c.get('freezing_seconds', 0):.3f} s, frozen "
      f"{c.get('frozen_seconds', 0):.3f} s, memory collected {c.get('memdump_seconds', 0):.3f} s and written "
      f"{c.get('memwrite_seconds', 0):.3f} s, {c.get('pages_written', 0)} pages of {c.get('pages_scanned', 0)} scanned "
      f"({c.get('pages_written', 0) * 4096 / 2**30:.2f} GiB); {len(r.get('tree') or [])} processes")
for g in r.get("gpu_processes") or []:
    steps = ", ".join(f"{p['name']} {p['seconds']:.3f}" for p in g.get("phases") or [])
    print(f"    GPU process {g.get('pid')}: {steps}")
PYEOF
}
# sync_counts: each GPU process's count of operations that wait for a peer
# (NCCL's launches, and those a replayed CUDA graph holds), from its stats.
sync_counts() {
	"$GPUCR" status --socket "$SOCK" --json >"$LOGS/sync-status.json" 2>/dev/null
	$PY - "$GPUCR" "$SOCK" "$LOGS/sync-status.json" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, subprocess, sys
gpucr, sock, status = sys.argv[1:4]
try:
    clients = json.load(open(status)).get("clients") or []
except ValueError:
    clients = []
counts = []
for c in clients:
    out = subprocess.run([gpucr, "client", str(c["pid"]), "stats", "--json", "--socket", sock],
                         capture_output=True, text=True).stdout
    try:
        counts.append(f"pid {c['pid']} {json.loads(out).get('sync_ops', '0')}")
    except ValueError:
        counts.append(f"pid {c['pid']} ?")
print("    operations that wait for a peer, counted: " + ", ".join(counts))
PYEOF
}
# tree_memory ROOT: the host memory of ROOT's tree a dump copies, a line a
# process (its private anonymous pages, those a fork shares with its parent
# included, since CRIU copies them for each process that has them; and
# shared memory), before the dump: where its pages come from.
tree_memory() {
	$PY - "$1" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import os, sys
def kids(p):
    out = []
    for t in os.listdir(f"/proc/{p}/task"):
        try:
            out += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            pass
    return out
todo, tree = [int(sys.argv[1])], []
while todo:
    p = todo.pop(0)
    tree.append(p)
    todo += kids(p)
tot = {}
for p in tree:
    m = {}
    try:
        for l in open(f"/proc/{p}/smaps_rollup"):
            f = l.split()
            if len(f) >= 2 and f[0].endswith(":") and f[1].isdigit():
                m[f[0][:-1]] = int(f[1]) / 1024
        comm = open(f"/proc/{p}/comm").read().strip()
        args = open(f"/proc/{p}/cmdline").read().split("\0")[1:3]
    except OSError:
        continue
    for k in ("Anonymous", "Shared_Dirty", "Rss"):
        tot[k] = tot.get(k, 0) + m.get(k, 0)
    print(f"    pid {p} ({comm} {' '.join(args)[:40]}): anonymous {m.get('Anonymous', 0):.0f} MiB, shared dirty {m.get('Shared_Dirty', 0):.0f} MiB, rss {m.get('Rss', 0):.0f} MiB")
print(f"    the tree's {len(tree)} processes: anonymous {tot.get('Anonymous', 0) / 1024:.2f} GiB, shared dirty {tot.get('Shared_Dirty', 0) / 1024:.2f} GiB")
PYEOF
}
# wait_done NAME FROMLINE SECS: until NAME.txt has "done" past FROMLINE.
wait_done() {
	for _ in $(seq $(($3 * 10))); do
		tail -n +"$(($2 + 1))" "$LOGS/$1.txt" 2>/dev/null | grep -q '^done' && return 0
		sleep 0.1
	done
	return 1
}

if part ddp; then
	note "### DDP, $NPROC ranks ($LAUNCH, NCCL defaults, DataLoader workers), $STEPS steps"
	# DDP_WHERE: each rank's view of its GPU (CUDA's bus id and UUID) every 40
	# steps; NCCL's own view is its init lines
	export DDP_DELAY=0.05 DDP_WHERE=40 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
	# the reference: plainly, with torchrun itself where the job is gpucr torchrun's
	if [ "$LAUNCH" = gpucr-torchrun ]; then LAUNCH=torchrun ddp_cmd "$LOGS/ddp.plain.txt"; else ddp_cmd "$LOGS/ddp.plain.txt"; fi
	timeout 300 "${cmd[@]}" </dev/null >"$LOGS/ddp.plain.out" 2>&1 ||
		bad "plain DDP: $(tail -3 "$LOGS/ddp.plain.out" | tr '\n' ' ')"
	for mode in $MODES; do
		name=ddp.$mode
		rm -rf "$IMG" && mkdir -p "$IMG"
		ddp_start "$name" || continue
		"$GPUCR" status --socket "$SOCK" >"$LOGS/$name.status" 2>&1
		[ $mode = leave ] && sed 's/^/    /' "$LOGS/$name.status" | head -12 | tee -a "$LOGS/summary.txt" >/dev/null
		[ $mode = stop ] && tree_memory "$JOB"
		sync_counts
		# the ranks' connections (the store, NCCL's bootstrap) are all inside the job; no iptables here.
		# NOFLAGS=1: none (a build that chooses CRIU's options for the tree itself).
		flags=(--tcp-established --link-remap --criu-opt 'network-lock skip')
		[ "${NOFLAGS:-}" = 1 ] && flags=()
		[ $mode = leave ] && flags+=(--leave-running)
		if ! timeout 300 "$GPUCR" checkpoint "$JOB" -D "$IMG" "${flags[@]}" --socket "$SOCK" --json >"$LOGS/$name-dump.json" 2>&1; then
			bad "$name dump: $(grep -v '^ *(' "$LOGS/$name-dump.json" | tail -3 | tr '\n' ' ')"
			cp "$IMG/dump.log" "$LOGS/$name-criu-dump.log" 2>/dev/null
			pkill -9 -f tests/gpu/ddp.py
			session_gone
			continue
		fi
		at=$(grep -c '^step' "$LOGS/$name.txt")
		note "$name: dumped at about step $at in $(secs "$LOGS/$name-dump.json" seconds) s (stopped $(secs "$LOGS/$name-dump.json" stall_seconds) s)"
		stop_breakdown "$LOGS/$name-dump.json"
		if [ $mode = leave ]; then
			wait_done "$name" 0 240 || bad "$name: the job did not finish after its dump"
			same_steps "$name" 0 "DDP after a --leave-running dump"
		fi
		pkill -9 -f tests/gpu/ddp.py
		session_gone
		tw=$(time_waits)
		mark=$(wc -l <"$LOGS/$name.txt")
		t0=$(now)
		if timeout 300 "$GPUCR" restore -D "$IMG" "${rflags[@]}" --socket "$SOCK" --json >"$LOGS/$name-restore.json" 2>&1; then
			for _ in $(seq 600); do [ "$(tail -n +"$((mark + 1))" "$LOGS/$name.txt" | grep -c '^step')" -ge 1 ] && break; sleep 0.05; done
			note "$name: restored right after the job ended ($tw connections of the host in TIME_WAIT then, $(time_waits) after); next step after $(span "$t0" "$(now)") ($(secs "$LOGS/$name-restore.json" seconds) s the command)"
			wait_done "$name" "$mark" 240 || bad "$name: the restored job did not finish"
			same_steps "$name" "$mark" "DDP restored ($mode)"
		else
			bad "$name restore: $(grep -v '^ *(' "$LOGS/$name-restore.json" | tail -3 | tr '\n' ' ')"
			cp "$IMG/restore.log" "$LOGS/$name-criu-restore.log" 2>/dev/null
			bind_conflicts "$LOGS/$name-criu-restore.log"
		fi
		pkill -9 -f tests/gpu/ddp.py
		session_gone
	done
	# the stopped job's image once more, with the GPUs swapped (reversed: rank r onto GPU NPROC-1-r)
	name=ddp.stop
	if [ "$SWAP" = 1 ] && [ -e "$IMG/gpucr" ] && grep -q '^done' "$LOGS/$name.txt"; then
		mark=$(wc -l <"$LOGS/$name.txt")
		wmark=$(wc -l <"$LOGS/$name.txt.where")
		if timeout 300 "$GPUCR" restore -D "$IMG" "${rflags[@]}" --device-map "$swap" --socket "$SOCK" --json >"$LOGS/$name-swapped.json" 2>&1; then
			sleep 3
			nvidia-smi --query-compute-apps=pid,gpu_bus_id,gpu_uuid --format=csv,noheader >"$LOGS/$name-swapped.smi" 2>&1
			wait_done "$name" "$mark" 240 || bad "$name: the job restored onto swapped GPUs did not finish: $(tail -3 "$LOGS/$name.out" | tr '\n' ' ')"
			note "$name onto swapped GPUs ($swap): restored in $(secs "$LOGS/$name-swapped.json" seconds) s"
			note "    each rank's CUDA view when it began (step rank pid bus uuid): $(head -"$NPROC" "$LOGS/$name.txt.where" | cut -d' ' -f2- | tr '\n' ';')"
			note "    after the restore: $(tail -n +"$((wmark + 1))" "$LOGS/$name.txt.where" | head -"$NPROC" | cut -d' ' -f2- | tr '\n' ';')"
			note "    nvidia-smi (pid, bus id, uuid) after the restore: $(grep -v '^$' "$LOGS/$name-swapped.smi" | tr '\n' ';')"
			same_steps "$name" "$mark" "DDP restored onto swapped GPUs"
		else
			bad "$name restore onto swapped GPUs: $(grep -v '^ *(' "$LOGS/$name-swapped.json" | tail -3 | tr '\n' ' ')"
			cp "$IMG/restore.log" "$LOGS/$name-swapped-criu-restore.log" 2>/dev/null
		fi
		grep -i 'nccl\|error' "$LOGS/$name.out" | tail -4 | cut -c1-200 | sed 's/^/    /' | tee -a "$LOGS/summary.txt" >/dev/null
		pkill -9 -f tests/gpu/ddp.py
		session_gone
	fi
	note "NCCL warnings: $(cat "$LOGS"/ddp.*.out | grep -c 'NCCL WARN') $(cat "$LOGS"/ddp.*.out | grep 'NCCL WARN' | head -2 | tr '\n' ';')"
	note "gpucr warnings: $(cat "$LOGS"/ddp.*.out | grep '^gpucr:' | cut -c1-160 | sort | uniq -c | sort -rn | head -4 | tr '\n' ';')"
fi

if part steps; then
	ROUNDS=${ROUNDS:-3}
	TSTEPS=${TSTEPS:-300}
	note "### DDP step times, $NPROC ranks, $TSTEPS steps, $ROUNDS interleaved rounds (plain, gpucr run)"
	for k in $(seq "$ROUNDS"); do
		for how in plain gpucr; do
			name=steps.$how.$k
			rm -f "$LOGS/$name.txt" "$LOGS/$name.times"
			pre=()
			[ $how = gpucr ] && pre=("$GPUCR" run --socket "$SOCK" --)
			STEPS=$TSTEPS ddp_cmd "$LOGS/$name.txt"
			DDP_DELAY=0 DDP_TIMES=$LOGS/$name.times timeout 300 "${pre[@]}" "${cmd[@]}" </dev/null >"$LOGS/$name.out" 2>&1 ||
				bad "$name: $(tail -2 "$LOGS/$name.out" | tr '\n' ' ')"
			pkill -9 -f tests/gpu/ddp.py 2>/dev/null
		done
		cmp -s <(grep '^step' "$LOGS/steps.plain.$k.txt") <(grep '^step' "$LOGS/steps.gpucr.$k.txt") ||
			bad "round $k: the run under gpucr printed other losses than the plain run"
	done
	$PY - "$LOGS" "$ROUNDS" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import statistics, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
med = {"plain": [], "gpucr": []}
for k in range(1, rounds + 1):
    for how in med:
        try:
            t = [float(l.split()[1]) for l in open(f"{logs}/steps.{how}.{k}.times") if int(l.split()[0]) >= 50]
        except OSError:
            t = []
        if t:
            med[how].append(statistics.median(t) * 1000)
for how, v in med.items():
    print(f"{how}: median step {statistics.median(v):.3f} ms (rounds: {', '.join(f'{x:.3f}' for x in v)})" if v else f"{how}: no times")
if med["plain"] and med["gpucr"]:
    print(f"gpucr run / plain: {statistics.median(med['gpucr']) / statistics.median(med['plain']):.3f}")
PYEOF
fi

# size_case NAME PID LOG: a stop-the-world dump of PID, then its restore to
# the next heartbeat; "NAME<TAB>DUMP<TAB>RESTORE<TAB>GPU-LAUNCH" (seconds:
# the restore to the next heartbeat, which sums all the GPU memory on the
# host, and to when GPU launches could begin) to size.tsv.
size_case() {
	local name=$1 pid=$2 log=$3 mark t0 t1 d r l f
	f=$LOGS/size-$(printf '%s' "$name" | tr -cs 'A-Za-z0-9' '-') # a plain file name
	rm -rf "$IMG" && mkdir -p "$IMG"
	if ! timeout 300 "$GPUCR" checkpoint "$pid" -D "$IMG" --socket "$SOCK" --json >"$f-dump.json" 2>&1; then
		bad "$name dump: $(grep -v '^ *(' "$f-dump.json" | tail -3 | tr '\n' ' ')"
		return
	fi
	pid_gone "$pid"
	mark=$(hbs "$log")
	t0=$(now)
	if timeout 300 "$GPUCR" restore -D "$IMG" --socket "$SOCK" --json >"$f-restore.json" 2>&1; then
		t1=$(next_heartbeat "$log" "$mark")
		d=$(secs "$f-dump.json" seconds)
		r=$([ -n "$t1" ] && span "$t0" "$t1" | tr -d ' s' || echo -)
		l=$(secs "$f-restore.json" ready gpu_launch_seconds)
		printf '%s\t%s\t%s\t%s\n' "${name% [0-9]*}" "$d" "$r" "$l" >>"$LOGS/size.tsv"
		note "$name: dump $d s (GPU $(secs "$f-dump.json" gpu seconds) s), restore to GPU launches $l s, to the next heartbeat ${r} s"
		note "    $(size_parts "$f-dump.json" "$f-restore.json")"
	else
		bad "$name restore: $(grep -v '^ *(' "$f-restore.json" | tail -3 | tr '\n' ' ')"
	fi
}

# size_parts DUMP_JSON RESTORE_JSON: where a dump's and a restore's time
# went (the slowest process's step where the processes run side by side;
# CRIU's handling of host memory, process after process, in all)
size_parts() {
	$PY - "$1" "$2" <<'PYEOF'
import json, sys
d, r = (json.load(open(f)) for f in sys.argv[1:3])
def slowest(rep, step):
    return max((ph["seconds"] for p in rep.get("gpu_processes", []) for ph in p["phases"] if ph["name"] == step), default=0)
def phase(rep, step):
    return sum(ph["seconds"] for ph in rep.get("phases", []) if ph["name"] == step)
g, c, rc = d["gpu"], d.get("criu", {}), r.get("criu", {})
print(f"dump: GPU copy {slowest(d, 'copy'):.3f} s ({g.get('bytes_moved', 0) / 1e9:.1f} of {g['bytes'] / 1e9:.1f} GB crossed PCIe),"
      f" driver checkpoint {slowest(d, 'driver-checkpoint'):.3f} s, CRIU memdump {c.get('memdump_seconds', 0):.3f} s"
      f" ({c.get('pages_written', 0)} pages); restore: CRIU {phase(r, 'criu-restore'):.3f} s ({rc.get('pages_restored', 0)} pages),"
      f" then GPU wait {phase(r, 'gpu-wait'):.3f} s, GPU load {r['gpu']['seconds']:.3f} s")
PYEOF
}

if part size; then
	SIZE_ROUNDS=${SIZE_ROUNDS:-3}
	note "### dump and restore: $NPROC ranks x $((SIZE_MIB * 2)) MiB (one per GPU) against one process of $((SIZE_MIB * 2)) MiB, $SIZE_ROUNDS interleaved rounds"
	# size_start LOG PROGRAM MIB [ARG...]: PROGRAM under gpucr run, its pid
	# in P once it has written 3 more heartbeats to LOG
	size_start() {
		local m log=$1 prog=$2 mib=$3
		shift 3
		m=$(hbs "$log")
		setsid "$GPUCR" run --socket "$SOCK" -- "$BIN/$prog" --mib "$mib" --iters 100000000 --hb-every 20 --interval-ms 5 "$@" \
			</dev/null >>"$log" 2>&1 &
		P=$!
		for _ in $(seq 1200); do [ "$(hbs "$log")" -ge $((m + 3)) ] && break; sleep 0.1; done
	}
	for k in $(seq "$SIZE_ROUNDS"); do
		size_start "$LOGS/size-one.log" heartbeat $((SIZE_MIB * 2))
		size_case "one process, one GPU $k" "$P" "$LOGS/size-one.log"
		pkill -9 -f "$BIN/heartbeat"
		for _ in $(seq 100); do pgrep -f "$BIN/heartbeat" >/dev/null || break; sleep 0.1; done
		size_start "$LOGS/size-two.log" peerapp "$SIZE_MIB" --ranks "$NPROC"
		size_case "$NPROC ranks, $NPROC GPUs $k" "$P" "$LOGS/size-two.log"
		pkill -9 -f "$BIN/peerapp"
		for _ in $(seq 100); do pgrep -f "$BIN/peerapp" >/dev/null || break; sleep 0.1; done
	done
	$PY - "$LOGS/size.tsv" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *vals = line.rstrip("\n").split("\t")
    cols = rows.setdefault(name, ([], [], []))
    for c, v in zip(cols, vals):
        if v != "-":
            c.append(float(v))
med = {n: [statistics.median(c) if c else None for c in cols] for n, cols in rows.items()}
for n, (d, r, l) in med.items():
    print(f"{n}: median dump {d or 0:.3f} s, restore to GPU launches {l or 0:.3f} s, to the next heartbeat {r or 0:.3f} s"
          f" ({len(rows[n][0])} rounds)")
one = med.pop("one process, one GPU", None)
name, many = next(iter(med.items()), (None, None))
if one and many and all(one) and all(many):
    print(f"{name} / one process: dump {many[0] / one[0]:.2f}x, restore to GPU launches {many[2] / one[2]:.2f}x,"
          f" to the next heartbeat {many[1] / one[1]:.2f}x")
PYEOF
fi
grep -h '"level":"warn"\|"level":"error"' "$LOGS/helper.log" | cut -c1-300 | sort | uniq -c | sort -rn | head -8 >"$LOGS/helper-warnings.txt"
note "helper warnings: $(wc -l <"$LOGS/helper-warnings.txt") kinds (helper-warnings.txt)"
exit $fail
