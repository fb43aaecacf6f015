#!/usr/bin/env bash
# The interposer and helper on a real GPU with real frameworks, in one call:
#
#   bash tests/gpu/bench-interposer.sh [PREFIX]
#
# PREFIX holds bin/gpucr and lib/libgpucr.so (default: build; carry a copy
# made by scripts/make-gpucr-bundle.sh where the machine has no Go). Steps:
#   1. start `gpucr helper` on a private socket; `gpucr status`
#   2. the test applications (heartbeat, ptrchase, vmmapp, stormapp) under
#      `gpucr run`: same final checksum as without; stormapp checks every byte
#   3. PyTorch (tests/gpu/torch_workloads.py): resnet, transformer, inference,
#      compile, ROUNDS (default 3) pairs of runs without and with the
#      interposer, the order alternating; every run's losses must be
#      identical; step time: the median over runs of each run's median step
#      (this VM's speed drifts by 20% between processes, so single runs say
#      little); overhead = gpucr / plain - 1
#   4. `gpucr status --json` while a PyTorch process runs under gpucr run,
#      then the quiesce/drain/drop/reimport/resume cycle on it (snapshot
#      before and after; the process must go on computing the same losses)
#   5. JAX, CuPy, Numba smoke runs under gpucr run: same value as without
#   6. allocbench: cuMemAlloc/cuMemFree latency without and with
#   7. launchbench: CPU cost per launch without, with (sampled scan), with
#      GPUCR_SCAN=all (every launch scanned)
# PARTS="apps torch cycle frameworks micro" selects sections (one GPU call
# may not fit them all).
# Prints a table; logs in build/gpu/interposer (and $OUT if set).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
ROOT=$(pwd)
PREFIX=${1:-build}
GPUCR=$PREFIX/bin/gpucr
STEPS=${STEPS:-40}
ROUNDS=${ROUNDS:-3}
# PARTS: which sections run (default all): apps torch cycle frameworks micro
PARTS=${PARTS:-apps torch cycle frameworks micro}
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
SOCK=$(mktemp -u /tmp/gpucr-bench.XXXXXX.sock)
PY=${PYTHON:-python3}

[ -x "$GPUCR" ] || { echo "bench-interposer.sh: $GPUCR missing" >&2; exit 2; }
fresh_logs build/gpu/interposer
note_host "$(hostname)"
note "torch: $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1 | tail -1)"

"$GPUCR" helper --socket "$SOCK" --log-level info >"$LOGS/helper.log" 2>&1 &
HELPER=$!
trap 'kill $HELPER 2>/dev/null; wait $HELPER 2>/dev/null; rm -f "$SOCK"' EXIT
for _ in $(seq 100); do "$GPUCR" status --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done
"$GPUCR" status --socket "$SOCK" 2>&1 | tee "$LOGS/status0.txt" | sed 's/^/  /'
under() { "$GPUCR" run --socket "$SOCK" -- "$@"; }

make -s gpu-apps >"$LOGS/make.log" 2>&1 || bad "make gpu-apps failed (see $LOGS/make.log)"

# --- 2. test applications ----------------------------------------------------
if want apps; then
note ""
note "## test applications (final checksum, without vs under gpucr run)"
if [ -x build/gpu/bin/heartbeat ]; then
	for c in "heartbeat --mib 64 --buffers 8" "ptrchase --mib 16" "vmmapp --mib 64"; do
		set -- $c
		a=$1; shift
		p=$(build/gpu/bin/$a "$@" --iters 30 --interval-ms 0 2>&1 | grep '^done')
		g=$(under build/gpu/bin/$a "$@" --iters 30 --interval-ms 0 2>"$LOGS/$a.err" | grep '^done')
		[ -n "$p" ] && [ "$p" = "$g" ] && r=equal || { r=DIFFER; fail=1; }
		note "| $a | $p | $g | $r |"
	done
	s=$(under build/gpu/bin/stormapp --threads 4 --rounds 400 --max-kib 65536 2>&1 | tail -1)
	note "| stormapp | $s |"
	case "$s" in *errors=0*) ;; *) bad "stormapp: $s" ;; esac
else
	bad "make gpu-apps failed (see $LOGS/make.log)"
fi
fi

# --- 3. PyTorch workloads ----------------------------------------------------
note ""
if want torch; then
note "## PyTorch: losses, and median step time (ms) over $ROUNDS interleaved pairs of runs"
note "| workload | losses (all runs) | plain: median of run medians (min-max) | gpucr | overhead |"
note "|---|---|---|---|---|"
med() { $PY -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["median_step_s"]*1000)' "$1" 2>/dev/null || echo nan; }
for w in resnet transformer inference compile; do
	for r in $(seq $ROUNDS); do
		if [ $((r % 2)) -eq 1 ]; then
			$PY tests/gpu/torch_workloads.py $w --steps $STEPS >"$LOGS/$w.a$r" 2>"$LOGS/$w.a$r.err"
			under $PY tests/gpu/torch_workloads.py $w --steps $STEPS >"$LOGS/$w.g$r" 2>"$LOGS/$w.g$r.err"
		else
			under $PY tests/gpu/torch_workloads.py $w --steps $STEPS >"$LOGS/$w.g$r" 2>"$LOGS/$w.g$r.err"
			$PY tests/gpu/torch_workloads.py $w --steps $STEPS >"$LOGS/$w.a$r" 2>"$LOGS/$w.a$r.err"
		fi
	done
	ref=$(awk '$1=="step"{print $3}' "$LOGS/$w.a1" | md5sum | cut -c1-8)
	eq="identical"
	for f in "$LOGS/$w".[ag][0-9]*; do
		case $f in *.err) continue ;; esac
		[ "$(awk '$1=="step"{print $3}' "$f" | md5sum | cut -c1-8)" = "$ref" ] && [ "$(grep -c '^step' "$f")" -eq "$STEPS" ] || eq="DIFFER"
	done
	[ $eq = identical ] || fail=1
	stat() { for r in $(seq $ROUNDS); do med "$LOGS/$w.$1$r"; done | $PY -c 'import sys,statistics as s; v=[float(x) for x in sys.stdin]; print(f"{s.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")'; }
	a=$(stat a); g=$(stat g)
	ov=$($PY -c "a=float('$a'.split()[0]); g=float('$g'.split()[0]); print(f'{(g/a-1)*100:+.1f}%')" 2>/dev/null || echo "?")
	note "| $w | $eq ($STEPS steps x $((2 * ROUNDS)) runs) | $a | $g | $ov |"
	grep -h '^gpucr:' "$LOGS/$w.g1.err" | head -3 | sed 's/^/    /' | tee -a "$LOGS/summary.txt" >/dev/null
done
fi

# --- 4. status and the quiesce cycle on a live PyTorch process ---------------
if want cycle; then
note ""
note "## quiesce/drain/drop/reimport/resume on a live PyTorch process"
under $PY tests/gpu/torch_workloads.py transformer --steps 400 >"$LOGS/cycle.out" 2>"$LOGS/cycle.err" &
BG=$!
for _ in $(seq 300); do [ "$(grep -c '^step' "$LOGS/cycle.out")" -ge 20 ] && break; sleep 0.1; done
"$GPUCR" status --socket "$SOCK" --json >"$LOGS/status-live.json" 2>&1
"$GPUCR" status --socket "$SOCK" 2>&1 | sed 's/^/  /' | tee -a "$LOGS/summary.txt"
# The client's pid (the background job is a subshell around it).
TP=$($PY -c 'import json,sys; c=[c for c in json.load(open(sys.argv[1]))["clients"] if "python" in c["program"]]; print(c[0]["pid"] if c else "")' "$LOGS/status-live.json")
[ -n "$TP" ] || bad "cycle: the PyTorch process is not a client"
"$GPUCR" client $TP stats --json --socket "$SOCK" >"$LOGS/cycle-stats.json" 2>&1
note "  stats: $(tr -d ' \n' <"$LOGS/cycle-stats.json" | cut -c1-400)"
cyc_ok=1
for i in 1 2 3; do
	t0=$(date +%s.%N)
	for op in quiesce drain snapshot drop reimport snapshot resume; do
		"$GPUCR" client $TP $op --json --socket "$SOCK" >"$LOGS/cycle-$i-$op.json" 2>&1 || { cyc_ok=0; note "cycle $i: $op failed: $(tail -2 "$LOGS/cycle-$i-$op.json")"; }
	done
	t1=$(date +%s.%N)
	note "cycle $i: $($PY -c "print(f'{$t1-$t0:.3f} s for 7 gpucr client calls')")"
	sleep 0.5
done
wait $BG; rc=$?
under $PY tests/gpu/torch_workloads.py transformer --steps 400 >"$LOGS/cycle-ref.out" 2>/dev/null &
wait $!
lc=$(awk '$1=="step"{print $3}' "$LOGS/cycle.out" | md5sum | cut -c1-8)
lr=$(awk '$1=="step"{print $3}' "$LOGS/cycle-ref.out" | md5sum | cut -c1-8)
[ $rc -eq 0 ] && [ $cyc_ok -eq 1 ] && [ "$lc" = "$lr" ] && note "cycle: 3 cycles, process exit 0, 400 losses identical to an uncycled run" ||
	bad "cycle: rc=$rc ops_ok=$cyc_ok losses $lc vs $lr"
fi

# --- 5. other frameworks -----------------------------------------------------
if want frameworks; then
note ""
note "## JAX, CuPy, Numba under gpucr run"
for f in jax cupy numba; do
	p=$($PY tests/gpu/smoke_frameworks.py $f 2>"$LOGS/$f.a.err" | grep '^smoke')
	g=$(under $PY tests/gpu/smoke_frameworks.py $f 2>"$LOGS/$f.g.err" | grep '^smoke')
	if [ -z "$p" ]; then
		r="fails without gpucr too: $(tail -1 "$LOGS/$f.a.err")"
	elif [ "$p" = "$g" ]; then
		r=equal
	else
		r=DIFFER
		fail=1
	fi
	note "| $f | $p | $g | $r | $(grep -h '^gpucr:' "$LOGS/$f.g.err" | head -1) |"
done
fi

# --- 6. allocation latency ---------------------------------------------------
if want micro; then
note ""
note "## cuMemAlloc/cuMemFree median latency (us): plain | gpucr"
if [ -x build/gpu/bin/allocbench ]; then
	build/gpu/bin/allocbench --reps 30 >"$LOGS/alloc.a" 2>&1
	under build/gpu/bin/allocbench --reps 30 >"$LOGS/alloc.g" 2>&1
	paste "$LOGS/alloc.a" "$LOGS/alloc.g" | awk '{printf "| %s %s | alloc %s free %s | alloc %s free %s |\n", $1, $2, $3, $4, $7, $8}' | tee -a "$LOGS/summary.txt"
fi

note ""
note "## launch cost (us per launch): plain | gpucr (sampled scan) | gpucr GPUCR_SCAN=all"
if [ -x build/gpu/bin/launchbench ]; then
	build/gpu/bin/launchbench --launches 50000 >"$LOGS/launch.a" 2>&1
	under build/gpu/bin/launchbench --launches 50000 >"$LOGS/launch.g" 2>&1
	GPUCR_SCAN=all under build/gpu/bin/launchbench --launches 50000 >"$LOGS/launch.n" 2>&1
	paste "$LOGS/launch.a" "$LOGS/launch.g" "$LOGS/launch.n" | awk '{printf "| %s | %s | %s | %s |\n", $2, $4, $8, $12}' | tee -a "$LOGS/summary.txt"
fi

fi

"$GPUCR" status --socket "$SOCK" >"$LOGS/status-end.txt" 2>&1
if [ -n "${OUT:-}" ]; then
	cp "$LOGS/summary.txt" "$OUT/" 2>/dev/null
	tar -czf "$OUT/interposer-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
fi
note ""
[ $fail -eq 0 ] && note "RESULT: all checks passed" || note "RESULT: FAILURES above"
exit $fail
