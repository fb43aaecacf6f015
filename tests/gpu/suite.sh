#!/usr/bin/env bash
# Several GPU scripts in one device call, each bounded in time, their logs
# kept together:
#
#   bash tests/gpu/suite.sh SECONDS 'NAME[:MAX]|ENV...|SCRIPT ARG...' ...
#
# Each step runs `env ENV... bash tests/gpu/SCRIPT ARG...` (ENV's assignments
# separated by ';', so that a value may hold spaces) under `timeout`:
# at most MAX seconds where given, and never more than what is left of
# SECONDS (the whole call's budget, counted from the suite's start) less 30 s
# for each step after it, so a step that hangs leaves time for the ones after
# it. A step with under 20 s left is skipped, and said so. Each step's logs go to build/gpu/suite/NAME (its LOGS), its output
# to build/gpu/suite/NAME.out; every step's summary and the suite's own lines
# to build/gpu/suite/suite.txt. With $OUT set (the device machine's return
# folder), suite.txt and one tar of build/gpu/suite come back there after each
# step, so a call that runs out of time still returns what was done. The
# scripts' own copies to $OUT are turned off (OUT is unset for them): a call
# returns at most 8 files.
#
# Example, from the repository root on the GPU machine:
#   bash tests/gpu/suite.sh 560 \
#     'blas||served/served-blas.sh .carry/gpucr' \
#     'cold:300|SERVED=1;MODES=plain template|cold-start.sh .carry/gpucr .carry/criu'
set -u
cd "$(dirname "$0")/../.."
budget=${1:?usage: suite.sh SECONDS STEP...}
shift
start=$(date +%s)
dir=build/gpu/suite
rm -rf "$dir" && mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
ret=${OUT:-}
say() { printf '%s\n' "$*" | tee -a "$dir/suite.txt"; }
save() {
	[ -n "$ret" ] || return 0
	cp "$dir/suite.txt" "$ret/suite.txt"
	tar -czf "$ret/suite-logs.tgz" -C "$(dirname "$dir")" "$(basename "$dir")" 2>/dev/null
}
left=$#
status=0
for step in "$@"; do
	IFS='|' read -r name envs cmd <<<"$step"
	max=${name#*:}
	[ "$max" = "$name" ] && max=
	name=${name%%:*}
	IFS=';' read -r -a envs <<<"$envs"
	read -r -a cmd <<<"$cmd"
	now=$(date +%s)
	remain=$((budget - (now - start)))
	share=$((remain - (left - 1) * 30))
	[ -n "$max" ] && [ "$max" -lt "$share" ] && share=$max
	left=$((left - 1))
	if [ "$share" -lt 20 ]; then
		say "== $name: skipped, ${remain} s left of the suite's $budget s"
		status=1
		continue
	fi
	say "== $name: ${envs[*]} ${cmd[*]} (up to $share s)"
	t0=$(date +%s.%N)
	env -u OUT LOGS="$dir/$name" "${envs[@]}" timeout -k 10 "$share" bash "tests/gpu/${cmd[0]}" "${cmd[@]:1}" >"$dir/$name.out" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	[ -f "$dir/$name/summary.txt" ] && sed 's/^/  /' "$dir/$name/summary.txt" >>"$dir/suite.txt"
	case $rc in
	0) say "== $name: passed in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", b-a}') s" ;;
	124 | 137) say "== $name: TIMED OUT after $share s; its output's end:" && tail -n 5 "$dir/$name.out" | sed 's/^/  /' | tee -a "$dir/suite.txt" && status=1 ;;
	*) say "== $name: FAILED (status $rc) in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", b-a}') s; its output's end:" && tail -n 5 "$dir/$name.out" | sed 's/^/  /' | tee -a "$dir/suite.txt" && status=1 ;;
	esac
	save
done
exit $status
