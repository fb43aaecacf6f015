#!/usr/bin/env bash
# Incremental GPU checkpoints: what crosses PCIe when little or nothing
# changed, for one or two builds in one call:
#
#   bash tests/gpu/bench-incremental.sh GPUCR_PREFIX [BASE_PREFIX] [GB...]
#
# PREFIX: scripts/make-gpucr-bundle.sh output. For each build and size
# (default 8): tests/gpu/static_work.py (N GB of PyTorch tensors that change
# only when told) under `gpucr run`, then `gpucr checkpoint --gpu-only
# --leave-running --json` into /dev/shm/.../1 (full), .../2 (--parent 1,
# nothing changed) and .../3 (--parent 2, after one byte changed in 10% of
# the 4 MiB chunks). Per checkpoint: the process's stall (the helper's
# total), the GPU phase (the phases gpu-hash and copy: hashing every chunk,
# recording those the image has, copying the rest), and (new builds: the helper's log) the chunks and
# bytes copied over PCIe and the time hashing on the GPU; the PCIe floor of
# the same call, and what copying just the changed bytes at that floor
# would take. BASE_PREFIX (optional, a directory holding bin/gpucr) runs the
# sizes in BASE_GB (default 8) with that build too, as the baseline.
# IMG_ROOT (default /dev/shm) is where the images go: a tmpfs mounted with
# huge=always writes new chunk files 2.5x faster than one without (measured
# on the CI machine), e.g. mount -t tmpfs -o huge=always,size=80g tmpfs DIR.
# Prints a table; logs in build/gpu/incremental (and $OUT).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
prefix_arg "usage: bench-incremental.sh GPUCR_PREFIX [BASE_PREFIX] [GB...]" "$@"
NEW=$G
shift
BASE=
if [ $# -gt 0 ] && [ -x "$1/bin/gpucr" ]; then
	BASE=$1
	shift
fi
SIZES=${*:-8}
PY=${PYTHON:-python3}
fresh_logs build/gpu/incremental
# A run cut short (timeout sends TERM) must not leave its helper and GPU
# workload holding the GPU's memory for whatever the caller runs next.
IMGS=()
cleanup() {
	local j
	for j in $(jobs -p); do kill -9 "$j" 2>/dev/null; done
	wait 2>/dev/null
	[ ${#IMGS[@]} -gt 0 ] && rm -rf "${IMGS[@]}"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

pcie_floor
note_host "PCIe floor device->host $DTOH GB/s (pinned 4 GiB, best of 3); images in ${IMG_ROOT:-/dev/shm} ($(findmnt -no FSTYPE,OPTIONS -T "${IMG_ROOT:-/dev/shm}" 2>/dev/null))"
note ""
note "| build | GB | checkpoint | stall (helper total) | GPU phase (hash + copy) | chunks copied | bytes over PCIe | GPU hash | changed bytes at the floor |"
note "|---|---|---|---|---|---|---|---|---|"

# field NAME FILE: a number from the --json reply in FILE (phases: "phase:copy").
field() {
	$PY -c "
import json, sys
l = [x for x in open(sys.argv[2]) if x.startswith('{')]
r = json.loads(l[-1]) if l else {}
k = sys.argv[1]
if k.startswith('phase:'):
    print(sum(p.get('seconds', 0) for p in r.get('phases', []) if p.get('name') in k[6:].split('+')))
else:
    print(r.get(k, 0))" "$1" "$2"
}
# hashlog HELPERLOG N: chunks, copied, bytes_copied and gpu_hash of the Nth
# "GPU memory into the image" line of a helper log ("n/a" for builds that
# do not write it).
hashlog() {
	$PY -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if 'GPU memory into the image' in l]
n = int(sys.argv[2])
if len(rows) < n: print('n/a n/a n/a n/a'); sys.exit()
r = rows[n - 1]
print(r.get('chunks', 0), r.get('copied', 0), r.get('bytes_copied', 0), f\"{r.get('gpu_hash', 0) * 1e3:.1f}ms\")" "$1" "$2"
}

one() { # one BUILD-NAME PREFIX GB
	local name=$1 pre=$2 gb=$3
	local G=$pre/bin/gpucr L=$LOGS/$name-$gb IMG=${IMG_ROOT:-/dev/shm}/gpucr-incr-$name-$gb
	mkdir -p "$L"
	rm -rf "$IMG"
	IMGS+=("$IMG")
	local SOCK
	SOCK=$(mktemp -u /tmp/gpucr-incr.XXXXXX.sock)
	"$G" helper --socket "$SOCK" --log-level info >"$L/helper.log" 2>&1 &
	local HP=$!
	for _ in $(seq 100); do "$G" status --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done
	: >"$L/cmd"
	setsid "$G" run --socket "$SOCK" -- $PY tests/gpu/static_work.py "$gb" "$L/work.log" "$L/cmd" </dev/null >"$L/work.out" 2>&1 &
	for _ in $(seq 1200); do grep -q '^ready' "$L/work.log" 2>/dev/null && break; sleep 0.1; done
	local P
	P=$(grep -o 'pid=[0-9]*' "$L/work.log" | head -1 | cut -d= -f2)
	if [ -z "$P" ]; then
		bad "$name $gb GB: the workload did not start: $(tail -3 "$L/work.out")"
		kill $HP 2>/dev/null
		return
	fi
	local k parent what
	for k in 1 2 3; do
		parent=()
		what="full"
		[ $k -gt 1 ] && parent=(--parent "$IMG/$((k - 1))") && what="unchanged, parent $((k - 1))"
		if [ $k = 3 ]; then
			echo "change 10 $gb" >>"$L/cmd"
			for _ in $(seq 600); do grep -q '^changed' "$L/work.log" && break; sleep 0.1; done
			what="10% of chunks changed, parent 2"
		fi
		"$G" checkpoint "$P" -D "$IMG/$k" --gpu-only --leave-running --socket "$SOCK" --json "${parent[@]}" >"$L/ckpt-$k.txt" 2>&1 ||
			bad "$name $gb GB checkpoint $k: $(tail -2 "$L/ckpt-$k.txt")"
		read -r chunks copied bytes hash < <(hashlog "$L/helper.log" $k)
		local floor="-"
		[ "$bytes" != n/a ] && floor=$($PY -c "print(f'{$bytes/1e9/$DTOH*1e3:.1f} ms')")
		note "| $name | $gb | $k: $what | $($PY -c "print(f'{$(field total_seconds "$L/ckpt-$k.txt"):.3f} s')") | $($PY -c "print(f'{$(field phase:gpu-hash+copy "$L/ckpt-$k.txt"):.3f} s')") | $copied of $chunks | $([ "$bytes" = n/a ] && echo "all (no GPU hashing)" || $PY -c "print(f'{$bytes/1e9:.3f} GB')") | $hash | $floor |"
	done
	"$G" image inspect "$IMG/3" >"$L/inspect-3.txt" 2>&1
	kill "$P" 2>/dev/null
	sleep 1
	kill $HP 2>/dev/null
	wait $HP 2>/dev/null
	rm -rf "$IMG"
}

for gb in $SIZES; do
	one new "$NEW" "$gb"
done
if [ -n "$BASE" ]; then
	for gb in ${BASE_GB:-8}; do
		one base "$BASE" "$gb"
	done
fi
[ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/incremental-summary.txt" && tar -czf "$OUT/incremental-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
exit $fail
