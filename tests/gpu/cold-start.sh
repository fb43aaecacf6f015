#!/usr/bin/env bash
# The cold start of a warmed-up inference server from a gpucr image, on the
# GPU machine, and where its seconds go:
#
#   bash tests/gpu/cold-start.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]
#
# tests/gpu/bench_start.py serves GIB (default 8.6) GiB of bf16 weights from
# a safetensors file in /dev/shm. Once plain, without gpucr: the seconds from
# its start to its first answer. Then, with each build: the server started
# under `gpucr run` and warmed up is dumped (`gpucr checkpoint PID -D DIR`:
# it ends), and restored ROUNDS (default 3) times (`gpucr restore -D DIR`,
# the restored server killed in between): the seconds from the restore
# command's start to the first answer of `GET /run`, which runs the whole
# model on the GPU again (its answer must equal the plain server's), and
# where they went: CRIU's log (until it forks the tasks, until its late hook
# once they are restored, until it ends) and the command's own phases (the
# wait for the GPU processes to have their memory back). BASE_PREFIX: an
# earlier build, in the same call. With LAZY=1 the new build's rounds are
# taken twice, plain and with `gpucr restore --lazy-pages` (the tree runs
# before its host memory is read back), interleaved; MODES="plain ondemand
# resident" takes them with `gpucr restore --on-demand` (the server runs
# while its GPU data loads) and from a resident image (`gpucr image load`
# before the round) too. SERVED=1: the new build's server runs in served mode
# (`gpucr run --served`, the helper with --served-pool 1), dumped with
# --template when MODES has "template": that mode loads the image with
# `gpucr image load --template` before the round (GPU data resident, a worker
# that ran the server's script), and the restore attaches to that worker.
# Logs in build/gpu/cold-start (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_criu_args "usage: cold-start.sh GPUCR_PREFIX CRIU_BUNDLE [BASE_PREFIX]" "$@"
BASE=${3:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
GIB=${GIB:-8.6}
ROUNDS=${ROUNDS:-3}
WEIGHTS=${WEIGHTS:-/dev/shm/gpucr-bench-weights.safetensors}
fresh_logs build/gpu/cold-start
use_criu "$C" || exit 1
IMG=/dev/shm/gpucr-cold-start
SOCK=/run/gpucr-cold-start/helper.sock
SERVER=$(pwd)/tests/gpu/bench_start.py
trap 'pkill -9 -f "$SERVER serve" 2>/dev/null; kill $HELPER 2>/dev/null; rm -rf "$IMG"' EXIT
[ -s "$WEIGHTS" ] || python3 tests/gpu/bench_start.py make "$WEIGHTS" --gib "$GIB" >"$LOGS/make.txt" 2>&1 || {
	bad "writing the weights: $(tail -2 "$LOGS/make.txt")"
	exit 1
}
note_host "$(du -h "$WEIGHTS" | cut -f1) of weights in $WEIGHTS"
ask() { python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode().strip())' "$1" 2>/dev/null; }
# first_answer PORT PID T0 OUT: polls /run until it answers; the seconds since T0 to OUT, the answer to OUT.answer.
first_answer() {
	local ans=
	for _ in $(seq 6000); do
		ans=$(ask "http://127.0.0.1:$1/run") && break
		kill -0 "$2" 2>/dev/null || break
		sleep 0.01
	done
	python3 -c "print(f'{$(now) - $3:.3f}')" >"$4"
	echo "$ans" >"$4.answer"
}

# Plain.
port=$((18000 + RANDOM % 1000))
t0=$(now)
setsid python3 "$SERVER" serve "$WEIGHTS" "$port" >"$LOGS/plain.out" 2>&1 &
pid=$!
first_answer "$port" "$pid" "$t0" "$LOGS/plain.seconds"
kill -- -"$pid" 2>/dev/null
wait "$pid" 2>/dev/null
PLAIN_ANSWER=$(cat "$LOGS/plain.seconds.answer")
note "plain start to the first answer: $(cat "$LOGS/plain.seconds") s (answer $PLAIN_ANSWER)"

run() {
	local name=$1 g=$2/bin/gpucr modes=${3:-plain} served=${4:-0}
	local runflags=() hflags=(--resident-memory 40G) ckflags=()
	if [ "$served" = 1 ]; then
		runflags=(--served)
		hflags+=(--served-pool 1)
		case " $modes " in *" template "*) ckflags=(--template) ;; esac
	fi
	rm -rf "$IMG" && mkdir -p "$IMG"
	start_helper "$g" "$SOCK" "$LOGS/$name-helper.log" "${hflags[@]}" || { bad "$name: helper"; return; }
	local port=$((19000 + RANDOM % 1000)) t0 pid P
	t0=$(now)
	# appended to, not truncated: a restored server that writes (served mode says where its globals went) would
	# leave the file longer than the image's record of it, which CRIU refuses at the next restore
	: >"$LOGS/$name-server.out"
	setsid "$g" run "${runflags[@]}" --socket "$SOCK" -- python3 "$SERVER" serve "$WEIGHTS" "$port" >>"$LOGS/$name-server.out" 2>&1 &
	pid=$!
	first_answer "$port" "$pid" "$t0" "$LOGS/$name-start.seconds"
	P=$(pgrep -f "^python3 $SERVER serve" | head -1)
	[ -n "$P" ] || { bad "$name: the server did not start: $(tail -n 3 "$LOGS/$name-server.out")"; kill $HELPER; return; }
	"$g" checkpoint "$P" -D "$IMG/d" --socket "$SOCK" --json "${ckflags[@]}" >"$LOGS/$name-dump.json" 2>&1 || { bad "$name dump: $(tail -n 3 "$LOGS/$name-dump.json")"; kill $HELPER; return; }
	pid_gone "$P"
	for r in $(seq "$ROUNDS"); do
	for mode in $modes; do
		local flags=() tag=$name-$mode-$r
		case $mode in
		lazy) flags=(--lazy-pages) ;;
		ondemand) flags=(--on-demand) ;;
		ondemand-lazy) flags=(--on-demand --lazy-pages) ;;
		resident) "$g" image load "$IMG/d" --socket "$SOCK" >"$LOGS/$tag-load.txt" 2>&1 || bad "$tag: image load: $(tail -n 2 "$LOGS/$tag-load.txt")" ;;
		template) "$g" image load "$IMG/d" --template --socket "$SOCK" >"$LOGS/$tag-load.txt" 2>&1 || bad "$tag: image load --template: $(tail -n 2 "$LOGS/$tag-load.txt")" ;;
		esac
		t0=$(now)
		"$g" restore -D "$IMG/d" --socket "$SOCK" --json "${flags[@]}" >"$LOGS/$tag.json" 2>&1 &
		local rp=$!
		first_answer "$port" "$rp" "$t0" "$LOGS/$tag.seconds"
		wait $rp || bad "$tag: $(tail -n 3 "$LOGS/$tag.json")"
		cp "$IMG/d/restore.log" "$LOGS/$tag.log" 2>/dev/null
		python3 - "$LOGS/$tag" "$name $mode" "$r" "$PLAIN_ANSWER" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import json, re, sys
base, name, r, plain = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
took = float(open(base + ".seconds").read())
ans = open(base + ".seconds.answer").read().strip()
text = open(base + ".json").read()
rep = json.loads(text[text.rindex("\n{") + 1:] if "\n{" in text else text)
ph = {p["name"]: p["seconds"] for p in rep.get("phases") or []}
marks = {}
try:
    for line in open(base + ".log"):
        m = re.match(r"\((\d+\.\d+)\)", line)
        if not m:
            continue
        t = float(m.group(1))
        for key, pat in (("fork", "Forking task"), ("late", "Run late stage hook"), ("end", "Restore finished successfully")):
            if pat in line and key not in marks:
                marks[key] = t
        marks["last"] = t
except OSError:
    pass
crit = f"CRIU: forking at {marks.get('fork', float('nan')):.2f} s, late hook at {marks.get('late', float('nan')):.2f} s, " \
       f"end at {marks.get('end', marks.get('last', float('nan'))):.2f} s"
c = rep.get("criu") or {}
rd = rep.get("ready") or {}
helper = ", ".join(f"{p['name']} {p['seconds']:.2f}" for g in rep.get("gpu_processes") or [] for p in g.get("phases") or [])
print(f"{name} restore {r}: first answer after {took:.2f} s ({'same answer' if ans == plain else 'ANSWER DIFFERS: ' + ans}); {crit}; "
      f"CRIU's stats: forking {c.get('forking_seconds', 0):.2f} s, restoring {c.get('restore_seconds', 0):.2f} s, "
      f"{c.get('pages_restored', 0) * 4096 / 2**20:.0f} MiB of pages; ready: " + ", ".join(f"{k} {v:.2f}" for k, v in rd.items()) +
      "; command phases: " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items()) + (f"; in the helper: {helper}" if helper else ""))
PYEOF
		pkill -9 -f "$SERVER serve"
		case $mode in resident | template) "$g" image unload "$IMG/d" --socket "$SOCK" >/dev/null 2>&1 ;; esac
		pid_gone "$P"
	done
	done
	note "$name: start under gpucr run to the first answer $(cat "$LOGS/$name-start.seconds") s"
	kill $HELPER 2>/dev/null
	wait $HELPER 2>/dev/null
}

run new "$G" "${MODES:-$([ "${LAZY:-0}" = 1 ] && echo "plain lazy" || echo plain)}" "${SERVED:-0}"
[ -n "$BASE" ] && run base "$BASE"
grep -q "ANSWER DIFFERS" "$LOGS/summary.txt" && fail=1
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/cold-start.txt"
exit $fail
