#!/usr/bin/env bash
# Replicas of one warmed-up inference server, restored at once from one
# resident image, each in its own runc container, on the GPU machine:
#
#   bash tests/gpu/replicas.sh GPUCR_PREFIX CRIU_BUNDLE RUNC_DIR [N]
#
# tests/gpu/bench_start.py serves GIB (default 8.6) GiB of bf16 weights from
# a safetensors file in /dev/shm, answering HTTP on a Unix socket in the
# container's /work (each container has its own host directory there). The
# server starts in one container under the interposer; the time to its first
# answer is the plain start. `runc checkpoint` (gpucr's plugin), `gpucr image
# load` of the image, then N (default 4) containers `runc restore`d from that
# one image at the same time: the seconds from the start of the restores to
# each replica's first answer to `GET /run` (the whole model run again; it
# must equal the original's), and the device memory they hold (nvidia-smi,
# and the helper's own count per process and for the resident copy). Logs in
# build/gpu/replicas (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
usage="usage: replicas.sh GPUCR_PREFIX CRIU_BUNDLE RUNC_DIR [N]"
prefix_criu_args "$usage" "$@"
R=${3:-}
abs_dir "$usage" C
abs_dir "$usage" R
N=${4:-4}
GIB=${GIB:-8.6}
export PATH="$R:$C/bin:$PATH" # runc, and the criu runc calls
fresh_logs build/gpu/replicas
WDIR=/dev/shm/gpucr-replica-weights
IMG=/dev/shm/gpucr-replicas-img
ROOT=$LOGS/runc-root
SOCK=/run/gpucr/helper.sock
BENCH=$(pwd)/tests/gpu
mkdir -p "$WDIR" "$ROOT" /run/gpucr
# CRIU saves and restores the netfilter tables of a container's own network
# namespace with iptables-save/-restore, which the GPU machine lacks: empty
# stand-ins there (the containers' tables are empty).
if ! command -v iptables-save >/dev/null; then
	mkdir -p "$LOGS/nf"
	for t in iptables ip6tables; do
		printf '#!/bin/sh\nexit 0\n' >"$LOGS/nf/$t-save"
		printf '#!/bin/sh\ncat >/dev/null\n' >"$LOGS/nf/$t-restore"
	done
	chmod +x "$LOGS/nf"/*
	export PATH="$LOGS/nf:$PATH"
fi
rm -rf "$IMG" && mkdir -p "$IMG"
[ -s "$WDIR/w.safetensors" ] || python3 "$BENCH/bench_start.py" make "$WDIR/w.safetensors" --gib "$GIB" >"$LOGS/make.txt" 2>&1 ||
	{ bad "weights: $(tail -n 2 "$LOGS/make.txt")"; exit 1; }
note_host "$(runc --version | head -1); $(criu --version | head -1); $(du -h "$WDIR/w.safetensors" | cut -f1) of weights"
start_helper "$G/bin/gpucr" "$SOCK" "$LOGS/helper.log" --resident-memory 64G || { bad "helper"; exit 1; }
ids=()
trap 'for i in "${ids[@]}"; do runc --root "$ROOT" delete -f "$i" >/dev/null 2>&1; done; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT

PY=$(command -v python3)
torch_container_flags
echo "libdir $G/lib/criu" >"$LOGS/criu.conf"
# bundle NAME: container NAME's bundle, its /work the host's $LOGS/NAME.
bundle() {
	mkdir -p "$LOGS/$1"
	bash scripts/oci-bundle.sh -w "$G:/gpucr" -w "$LOGS/$1:/work" -w /run/gpucr:/run/gpucr -w "$WDIR:/weights" -w "$BENCH:/bench" \
		"${extra[@]}" -e LD_PRELOAD=/gpucr/lib/libgpucr.so -e GPUCR_SOCKET=/run/gpucr/helper.sock \
		"$LOGS/$1-bundle" -- /bin/sh -c "exec $PY /bench/bench_start.py serve /weights/w.safetensors /work/sock >>/work/out.log 2>&1" \
		>"$LOGS/$1-bundle.txt" 2>&1 || return 1
	python3 - "$LOGS/$1-bundle/config.json" "$LOGS/criu.conf" <<'PYEOF'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c.setdefault("annotations", {})["org.criu.config"] = sys.argv[2]
# A network namespace of its own: the replicas restore the same abstract
# Unix sockets (the server has some), one name space per network namespace.
c["linux"]["namespaces"].append({"type": "network"})
json.dump(c, open(p, "w"), indent=2)
PYEOF
}
# first_answer NAME T0 [FAILED]: polls NAME's socket until it answers (for up to 60 s,
# or until the file FAILED, if given, exists: its restore failed); "SECONDS ANSWER".
first_answer() {
	local ans end=$(($(date +%s) + 60))
	while [ "$(date +%s)" -lt $end ]; do
		ans=$(timeout 10 python3 "$BENCH/bench_start.py" ask "$LOGS/$1/sock" 2>/dev/null) && break
		ans=
		[ -n "${3:-}" ] && [ -e "$3" ] && break
		sleep 0.01
	done
	echo "$(python3 -c "print(f'{$(now) - $2:.3f}')") ${ans:-none}"
}
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

mem0=$(used)
bundle orig || { bad "bundle: $(tail -n 2 "$LOGS/orig-bundle.txt")"; exit 1; }
ids+=(gpucr-orig)
t0=$(now)
runc --root "$ROOT" run -d --pid-file "$LOGS/orig.pid" -b "$LOGS/orig-bundle" gpucr-orig </dev/null >"$LOGS/orig-run.txt" 2>&1 ||
	{ bad "runc run: $(tail -n 3 "$LOGS/orig-run.txt")"; exit 1; }
read -r took ORIG < <(first_answer orig "$t0")
[ "$ORIG" != none ] || { bad "the server did not answer: $(tail -n 5 "$LOGS/orig/out.log")"; exit 1; }
note "original: start in a container under gpucr to its first answer $took s (answer $ORIG); device memory used $(( $(used) - mem0 )) MiB"
if ! runc --root "$ROOT" checkpoint --image-path "$IMG" --work-path "$LOGS/orig-cw" gpucr-orig >"$LOGS/checkpoint.txt" 2>&1; then
	bad "runc checkpoint: $(tail -n 3 "$LOGS/checkpoint.txt"; grep Error "$LOGS/orig-cw/dump.log" | tail -3)"
	exit 1
fi
"$G/bin/gpucr" image load "$IMG" --socket "$SOCK" >"$LOGS/load.txt" 2>&1 || { bad "image load: $(tail -n 2 "$LOGS/load.txt")"; exit 1; }
note "$(tail -n 1 "$LOGS/load.txt")"
mem1=$(used)
for r in $(seq "$N"); do
	bundle "r$r" || { bad "bundle r$r"; exit 1; }
	cp "$LOGS/orig/out.log" "$LOGS/r$r/out.log" # reopened as it was at the dump
	ids+=("gpucr-r$r")
done
t0=$(now)
jobs_=()
for r in $(seq "$N"); do
	{ timeout 120 runc --root "$ROOT" restore -d --image-path "$IMG" --work-path "$LOGS/r$r-cw" --pid-file "$LOGS/r$r.pid" \
		-b "$LOGS/r$r-bundle" "gpucr-r$r" </dev/null >"$LOGS/r$r-restore.txt" 2>&1 || touch "$LOGS/r$r.failed"; } &
	jobs_+=($!)
done
for r in $(seq "$N"); do
	first_answer "r$r" "$t0" "$LOGS/r$r.failed" >"$LOGS/r$r.answer" &
	jobs_+=($!)
done
wait "${jobs_[@]}" # not the helper, also a child of this shell
last=0
for r in $(seq "$N"); do
	read -r took ans <"$LOGS/r$r.answer"
	[ "$ans" = "$ORIG" ] || bad "replica $r: answer $ans, want $ORIG ($(tail -n 3 "$LOGS/r$r-restore.txt"))"
	note "replica $r: first answer $took s after the restores began ($([ "$ans" = "$ORIG" ] && echo same answer || echo "ANSWER $ans"))"
	last=$(python3 -c "print(max($last, $took))")
done
"$G/bin/gpucr" status --socket "$SOCK" --json >"$LOGS/status.json" 2>&1
note "all $N replicas answered within $last s; device memory used: $(( mem1 - mem0 )) MiB with the resident copy alone, $(( $(used) - mem0 )) MiB with the $N replicas beside it"
python3 - "$LOGS/status.json" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, sys
s = json.load(open(sys.argv[1]))
gib = lambda b: f"{b / 2**30:.2f} GiB"
cl = [c for c in s.get("clients") or [] if c.get("bytes")]
res = s.get("resident_images") or []
print(f"the helper holds: {len(cl)} processes with {gib(sum(c['bytes'] for c in cl))} "
      f"({', '.join(gib(c['bytes']) for c in cl)}), resident copy {gib(sum(r['bytes'] for r in res))} "
      f"(restores from it: {sum(r['restores'] for r in res)})")
PYEOF
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/replicas.txt"
exit $fail
