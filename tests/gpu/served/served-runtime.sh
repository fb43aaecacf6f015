#!/usr/bin/env bash
# Served mode's runtime library (intercept/runtime: the CUDA runtime made of
# the driver API) on the GPU machine:
#
#   bash tests/gpu/served/served-runtime.sh GPUCR_PREFIX
#
# 0. what the installed libraries (PyTorch's, NVIDIA's, every .so under the
#    site directory) import from libcudart.so.13 that the runtime library does
#    not define (rt-missing.txt): a library that imports one does not load;
# 1. rtapp.cu (nvcc -cudart shared): NVIDIA's runtime, gpucr's runtime on the
#    driver (LD_PRELOAD, no gpucr), and served (gpucr run --served): the same
#    final checksum;
# 2. torch_rt.py (PyTorch's own kernels, a CUDA graph; CASES), plain and
#    served: the same checksum; with --matmul (cuBLAS) and --linear (cuBLASLt)
#    too, whose calls served mode forwards at the libraries' boundary.
# Logs in build/gpu/served-rt (and $OUT).
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh
prefix_arg "usage: served-runtime.sh GPUCR_PREFIX" "$@"
fresh_logs build/gpu/served-rt
RT=$G/lib/served/libcudart.so.13
SOCK=/run/gpucr/served-rt.sock
HELPER=
trap 'kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && tar -czf "$OUT/served-rt-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
note_host
PY=${PYTHON:-python3}

# ---- 0. imports ----
site=$($PY -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
find "$site" -name '*.so*' -type f 2>/dev/null | while read -r f; do
	objdump -T "$f" 2>/dev/null | awk -v f="${f#"$site"/}" '/\*UND\*/ && /\(libcudart\.so\.13\)/ {print $NF, f}'
done | sort >"$LOGS/cudart-imports.txt"
objdump -T "$RT" | awk '!/\*UND\*/ && /libcudart\.so\.13/ {print $NF}' | sort -u >"$LOGS/rt-exports.txt"
awk 'NR==FNR {have[$1]=1; next} !($1 in have)' "$LOGS/rt-exports.txt" "$LOGS/cudart-imports.txt" >"$LOGS/rt-missing.txt"
note "## imports from libcudart.so.13: $(awk '{print $1}' "$LOGS/cudart-imports.txt" | sort -u | wc -l) functions; not defined by gpucr's runtime: $(awk '{print $1}' "$LOGS/rt-missing.txt" | sort -u | wc -l)"
awk '{print $1}' "$LOGS/rt-missing.txt" | sort | uniq -c | sort -rn | head -40 | tee -a "$LOGS/summary.txt"
awk '{print $2}' "$LOGS/rt-missing.txt" | sort | uniq -c | sort -rn | head -20 | tee -a "$LOGS/summary.txt"
# The same for served mode's cuBLAS and cuBLASLt, against PyTorch's own libraries (NVIDIA's other libraries
# that import them, cuSOLVER's say, run in no served process yet); with the flags of PyTorch's libraries
# (BIND_NOW would need every import defined at load).
for lib in libcublas.so.13 libcublasLt.so.13; do
	find "$site/torch" -name '*.so*' -type f 2>/dev/null | while read -r f; do
		objdump -T "$f" 2>/dev/null | awk -v f="${f#"$site"/}" -v v="($lib)" '/\*UND\*/ && index($0, v) {print $NF, f}'
	done | sort >"$LOGS/$lib-imports.txt"
	objdump -T "$G/lib/served/$lib" | awk -v v="$lib" '!/\*UND\*/ && index($0, v) {print $NF}' | sort -u >"$LOGS/$lib-exports.txt"
	awk 'NR==FNR {have[$1]=1; next} !($1 in have)' "$LOGS/$lib-exports.txt" "$LOGS/$lib-imports.txt" >"$LOGS/$lib-missing.txt"
	note "## imports from $lib: $(awk '{print $1}' "$LOGS/$lib-imports.txt" | sort -u | wc -l) functions; not defined by gpucr's: $(awk '{print $1}' "$LOGS/$lib-missing.txt" | sort -u | tr '\n' ' ')"
done
readelf -d "$site/torch/lib/libtorch_cuda.so" 2>/dev/null | grep -E 'FLAGS|RUNPATH|RPATH' | tee -a "$LOGS/summary.txt"

start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info --served-pool 2 || { bad "the helper did not answer"; exit 1; }
pre() {
	case $1 in
	plain) ;;
	rtlib) echo "env LD_PRELOAD=$RT" ;;
	served) echo "$GPUCR run --served --socket $SOCK --" ;;
	esac
}
# same NAME MODE... -- CMD...: runs CMD in each mode, and compares the final checksum line with plain's
same() {
	local name=$1 m p s
	shift
	local modes=()
	while [ "$1" != -- ]; do modes+=("$1"); shift; done
	shift
	p=$(timeout 300 "$@" 2>&1 | tee "$LOGS/$name.plain" | grep '^done' | tail -1)
	[ -n "$p" ] || bad "$name plain: $(tail -3 "$LOGS/$name.plain" | tr '\n' ' ')"
	for m in "${modes[@]}"; do
		local t0 t1
		t0=$(now)
		# shellcheck disable=SC2046 # pre is a list of words
		s=$(timeout 300 $(pre "$m") "$@" 2>&1 | tee "$LOGS/$name.$m" | grep '^done' | tail -1)
		t1=$(now)
		if [ -n "$p" ] && [ "$p" = "$s" ]; then
			note "  $name ($m): same ($p), $(span "$t0" "$t1")"
		else
			bad "  $name ($m): plain '$p', got '$s' ($(grep -v '^hb' "$LOGS/$name.$m" | tail -4 | tr '\n' ' '))"
		fi
	done
}

# ---- 1. rtapp ----
note "## rtapp (nvcc -cudart shared)"
if nvcc -O2 -arch=sm_90 -cudart shared -o "$LOGS/rtapp" tests/gpu/served/rtapp.cu >"$LOGS/nvcc.log" 2>&1; then
	same rtapp rtlib served -- "$LOGS/rtapp" --mib 64 --iters 20
else
	bad "nvcc: $(tail -3 "$LOGS/nvcc.log")"
fi

# ---- 2. PyTorch ----
note "## PyTorch"
while read -r name args; do
	[ -n "$name" ] || continue
	# shellcheck disable=SC2086 # args is a list of words
	same "$name" ${MODES:-rtlib served} -- $PY tests/gpu/served/torch_rt.py $args
done <<<"${CASES:-torch --steps 8
torch-graph --steps 8 --graph
torch-matmul --steps 4 --matmul
torch-linear --steps 4 --linear}"
note "## helper log (served)"
grep -iE 'served|worker|error' "$LOGS/helper.log" | tail -15 >>"$LOGS/summary.txt"
exit "${fail:-0}"
