#!/usr/bin/env bash
# A module loaded as PTX, analysed by the helper, on the GPU machine:
#
#   bash tests/gpu/analysis-check.sh GPUCR_PREFIX [BASE_PREFIX]
#
# 1. ptx_kernel.py (CuPy, a RawModule compiled for a virtual architecture,
#    so cuModuleLoadData gets PTX) plain and under `gpucr run`: the same
#    checksums; under gpucr the helper analysed the module (the client's
#    modules_analysed, the helper's "module image analysed").
# 2. module_load.py (heartbeat's PTX loaded and unloaded 100 times): the
#    median load plain, under gpucr and under BASE_PREFIX's gpucr, in
#    alternating order, 3 rounds.
# Logs in build/gpu/analysis (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: analysis-check.sh GPUCR_PREFIX [BASE_PREFIX]" "$@"
BASE=${2:-}
[ -n "$BASE" ] && BASE=$(cd "$BASE" && pwd)
fresh_logs build/gpu/analysis
fail=0
SOCK=/run/gpucr-analysis/helper.sock
BSOCK=/run/gpucr-analysis/base.sock
HELPER= BHELPER=
finish() {
	kill $HELPER $BHELPER 2>/dev/null
	[ -n "${OUT:-}" ] && tar -czf "$OUT/analysis-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
}
trap finish EXIT
note "## a module loaded as PTX, analysed by the helper"
note_host
start_helper "$G/bin/gpucr" "$SOCK" "$LOGS/helper.log" --log-level debug || bad "the helper did not answer"

# 1. CuPy, PTX.
hb() { awk '$1 == "hb"' "$1"; }
echo | timeout 120 python3 tests/gpu/ptx_kernel.py 40 >"$LOGS/ptx.plain" 2>&1 || bad "ptx_kernel.py plain: $(tail -n 3 "$LOGS/ptx.plain")"
mkfifo "$LOGS/in"
timeout 120 "$G/bin/gpucr" run --socket "$SOCK" -- python3 tests/gpu/ptx_kernel.py 40 <"$LOGS/in" >"$LOGS/ptx.gpucr" 2>&1 &
app=$!
exec 3>"$LOGS/in"
for _ in $(seq 600); do [ "$(hb "$LOGS/ptx.gpucr" | wc -l)" -ge 40 ] && break; kill -0 $app 2>/dev/null || break; sleep 0.1; done
P=$(grep -o 'ready pid=[0-9]*' "$LOGS/ptx.gpucr" | head -1 | cut -d= -f2)
if [ -n "$P" ]; then
	"$G/bin/gpucr" client "$P" stats --socket "$SOCK" --json >"$LOGS/stats.json" 2>&1
fi
echo >&3
exec 3>&-
wait $app || bad "ptx_kernel.py under gpucr: exit $?: $(tail -n 3 "$LOGS/ptx.gpucr")"
analysed=$(grep -o '"modules_analysed": *"*[0-9]*' "$LOGS/stats.json" | grep -o '[0-9]*$')
note "ptx_kernel.py: $(grep -o 'arch=[a-z_0-9]*' "$LOGS/ptx.plain"), $(hb "$LOGS/ptx.plain" | wc -l) steps; modules_analysed ${analysed:-?} (gpucr client stats); helper: $(grep -c 'module image analysed' "$LOGS/helper.log") analysed, $(grep -c 'module image not analysed' "$LOGS/helper.log") not"
grep 'module image analysed' "$LOGS/helper.log" | tail -n 2 | cut -c1-300 >>"$LOGS/summary.txt"
if [ -n "$(hb "$LOGS/ptx.plain")" ] && [ "$(hb "$LOGS/ptx.plain")" = "$(hb "$LOGS/ptx.gpucr")" ]; then
	note "ptx_kernel.py: checksums identical plain and under gpucr"
else
	bad "ptx_kernel.py: checksums differ: $(diff <(hb "$LOGS/ptx.plain") <(hb "$LOGS/ptx.gpucr") | head -3 | tr '\n' ' ')"
fi
[ "${analysed:-0}" -ge 1 ] 2>/dev/null || bad "the helper analysed no module of ptx_kernel.py"

# 2. The cost of a PTX load, alternating.
[ -n "$BASE" ] && { start_helper "$BASE/bin/gpucr" "$BSOCK" "$LOGS/base-helper.log" || bad "the base helper did not answer"; }
for round in 1 2 3; do
	note "round $round: plain: $(python3 tests/gpu/module_load.py 100 2>&1 | tail -n 1)"
	note "round $round: gpucr: $("$G/bin/gpucr" run --socket "$SOCK" -- python3 tests/gpu/module_load.py 100 2>&1 | tail -n 1)"
	[ -n "$BASE" ] && note "round $round: base:  $("$BASE/bin/gpucr" run --socket "$BSOCK" -- python3 tests/gpu/module_load.py 100 2>&1 | tail -n 1)"
done
exit $fail
