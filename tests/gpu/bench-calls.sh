#!/usr/bin/env bash
# The cost table of the interposer: what `gpucr run` adds to each driver call
# a training step makes most, and to allocations, on the GPU machine:
#
#   bash tests/gpu/bench-calls.sh GPUCR_PREFIX [BASE_INTERPOSER]
#
# ROUNDS (default 5) rounds, each running, in an order that alternates,
#   callbench (tests/apps/callbench.c: launches from 1 and 8 threads, small
#   async copies and memsets, event records, stream syncs, graph launches;
#   CALLS calls each, default 200000) and allocbench (cuMemAlloc + cuMemFree
#   of 4 KiB .. 1 GiB, REPS each, default 20)
# plain, under `gpucr run`, and under `gpucr run` with BASE_INTERPOSER (an
# older libgpucr.so, to compare builds) where given, and under `gpucr run`
# with GPUCR_SCAN=0 (no sampled launch scan); allocbench also under
# `gpucr run` with a helper that keeps an allocation pool (`pool`:
# --alloc-pool 256M) and with one that keeps no exported allocation
# (`nokeep`: --export-keeper=false), and
# exportbench (tests/apps/exportbench.c: what an export costs beside what the
# process holds) plain. The table gives each case's median over the rounds
# (min-max) and the added time against plain.
# The helper's CPU time while the gpucr runs ran is reported too (its copy
# lanes must not spin). Logs in build/gpu/calls (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: bench-calls.sh GPUCR_PREFIX [BASE_INTERPOSER]" "$@"
BASE=${2:-}
ROUNDS=${ROUNDS:-5}
CALLS=${CALLS:-200000}
REPS=${REPS:-20}
fresh_logs build/gpu/calls
BIN=${BIN:-build/gpu/bin}
[ -x "$BIN/callbench" ] || make -s gpu-apps >"$LOGS/make.txt" 2>&1 || { bad "make gpu-apps"; exit 1; }
SOCK=/run/gpucr/calls-helper.sock
trap 'kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && tar -czf "$OUT/calls-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
HELPER=
HELPER_FLAGS=none
# helper_for MODE: the helper MODE needs is the one running (started anew
# where its flags differ)
helper_for() {
	local flags=""
	case $1 in
	plain) return 0 ;;
	pool) flags="--alloc-pool 256M" ;;
	nokeep) flags="--export-keeper=false" ;;
	esac
	[ "$flags" = "$HELPER_FLAGS" ] && return 0
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null && wait "$HELPER" 2>/dev/null
	HELPER_FLAGS=$flags
	# shellcheck disable=SC2086 # flags is a list
	start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info $flags || bad "the helper ($1) did not answer"
}
# cpu_s PID: user + system CPU seconds of PID so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }

# noscan: gpucr run without the sampled launch scan (GPUCR_SCAN=0), to price it
modes="plain gpucr noscan pool nokeep"
[ -n "$BASE" ] && modes="plain gpucr noscan base pool nokeep"
helper_cpu=0
gpucr_wall=0
for r in $(seq "$ROUNDS"); do
	order=$modes
	[ $((r % 2)) = 0 ] && order=$(echo "$modes" | tr ' ' '\n' | tac | xargs)
	for m in $order; do
		pre=()
		envs=()
		case $m in
		gpucr) pre=("$GPUCR" run --socket "$SOCK" --) ;;
		noscan) pre=("$GPUCR" run --socket "$SOCK" --) envs=(GPUCR_SCAN=0) ;;
		base) pre=("$GPUCR" run --socket "$SOCK" --) envs=(GPUCR_INTERPOSER="$(cd "$(dirname "$BASE")" && pwd)/$(basename "$BASE")") ;;
		esac
		case $m in
		pool | nokeep) pre=("$GPUCR" run --socket "$SOCK" --) ;;
		esac
		helper_for "$m"
		c0=$( [ -n "$HELPER" ] && cpu_s $HELPER || echo 0)
		t0=$(now)
		case $m in
		pool | nokeep) ;; # allocations only
		*) env "${envs[@]}" timeout 300 "${pre[@]}" "$BIN/callbench" --calls "$CALLS" >"$LOGS/calls.$m.$r" 2>&1 || bad "callbench $m round $r: $(tail -2 "$LOGS/calls.$m.$r" | tr '\n' ' ')" ;;
		esac
		env "${envs[@]}" timeout 300 "${pre[@]}" "$BIN/allocbench" --reps "$REPS" >"$LOGS/alloc.$m.$r" 2>&1 || bad "allocbench $m round $r: $(tail -2 "$LOGS/alloc.$m.$r" | tr '\n' ' ')"
		[ $m = plain ] && { timeout 120 "$BIN/exportbench" --reps "$REPS" >"$LOGS/export.$r" 2>&1 || bad "exportbench round $r: $(tail -2 "$LOGS/export.$r" | tr '\n' ' ')"; }
		if [ "$m" = gpucr ]; then
			helper_cpu=$(python3 -c "print($helper_cpu + $(cpu_s $HELPER) - $c0)")
			gpucr_wall=$(python3 -c "print($gpucr_wall + $(now) - $t0)")
		fi
	done
done

note "## What gpucr run adds to each call"
note_host "$ROUNDS rounds, $CALLS calls per case, $REPS allocations per size"
python3 - "$LOGS" "$ROUNDS" "$modes" <<'PYEOF' | tee -a "$LOGS/summary.txt"
import statistics, sys
logs, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def read(kind, m):
    vals = {}
    for r in range(1, rounds + 1):
        try:
            lines = open(f"{logs}/{kind}.{m}.{r}").read().split("\n")
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if kind == "calls" and len(f) == 3 and f[0] == "cost" and f[2] != "-":
                vals.setdefault(f[1], []).append(float(f[2]))
            elif kind == "alloc" and len(f) == 4 and f[0] == "alloc":
                size = int(f[1])
                name = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
                vals.setdefault(f"alloc {name}", []).append(float(f[2]) * 1000)
                vals.setdefault(f"free {name}", []).append(float(f[3]) * 1000)
    return vals
def fmt(ns):
    return f"{ns / 1000:.2f} us" if ns >= 10000 else f"{ns:.0f} ns"
for kind in ("calls", "alloc"):
    kmodes = [m for m in modes if read(kind, m)]
    data = {m: read(kind, m) for m in kmodes}
    names = {"gpucr": "gpucr run", "noscan": "GPUCR_SCAN=0", "base": "base build", "pool": "with the pool", "nokeep": "no kept export"}
    head = "| case | plain, median (min-max) |" + "".join(f" {names[m]} | added |" for m in kmodes[1:])
    print(); print(head); print("|" + "---|" * (head.count("|") - 1))
    for case in data["plain"]:
        p = data["plain"][case]
        row = f"| {case} | {fmt(statistics.median(p))} ({fmt(min(p))}-{fmt(max(p))}) |"
        for m in kmodes[1:]:
            g = data[m].get(case)
            if not g:
                row += " - | - |"
                continue
            row += f" {fmt(statistics.median(g))} ({fmt(min(g))}-{fmt(max(g))}) | {statistics.median(g) - statistics.median(p):+.0f} ns |"
        print(row)
# exportbench: medians over the rounds of each round's medians, per mode
ex = {}
for r in range(1, rounds + 1):
    try:
        lines = open(f"{logs}/export.{r}").read().split("\n")
    except OSError:
        continue
    seen = {}
    for ln in lines:
        f = ln.split()
        if len(f) == 7 and f[0] == "export":
            k = f"{f[1]} ({seen.setdefault(f[1], 0) + 1})" if f[1] == "alone" else f[1]
            seen[f[1]] = seen.get(f[1], 0) + 1
            ex.setdefault(k, []).append([float(x) for x in f[2:]])
if ex:
    print("\nexportbench (2 MiB, in one process; us, median over rounds):\n")
    print("| beside it, the process holds | create | export | import | reserve+map+access | teardown |")
    print("|---|---|---|---|---|---|")
    for k, rows in ex.items():
        print(f"| {k} | " + " | ".join(f"{statistics.median(col):.0f}" for col in zip(*rows)) + " |")
PYEOF
note ""
note "helper CPU time while the gpucr runs ran: $(python3 -c "print(f'{$helper_cpu:.2f} s in {$gpucr_wall:.1f} s')")"
exit $fail
