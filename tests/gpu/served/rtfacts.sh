#!/usr/bin/env bash
# The facts served mode's runtime library rests on, read on the GPU machine
# (no gpucr needed):
#
#   bash tests/gpu/served/rtfacts.sh
#
# - which functions of cudart, cuBLAS(Lt), cuDNN and the other CUDA
#   libraries PyTorch's and CuPy's libraries import, with their symbol
#   versions (the stubs must define the same version nodes);
# - the version nodes libcudart.so.13 defines;
# - what nvcc's host code calls to register a fat binary and launch a kernel;
# - the headers, packed for reading (layouts and enum values are checked by
#   rtabi.c against them, never copied).
# Results in $OUT (or build/gpu/served).
set -u
cd "$(dirname "$0")/../../.."
O=${OUT:-build/gpu/served}
mkdir -p "$O"
PY=${PYTHON:-python3}
exec > >(tee "$O/rtfacts.txt") 2>&1
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CU=$(dirname "$(dirname "$NVCC")")
INC=$CU/include
[ -f "$INC/cuda_runtime_api.h" ] || INC=$CU/targets/x86_64-linux/include
echo "nvcc: $NVCC; include: $INC"
"$NVCC" --version | tail -2
SITE=$($PY -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
TL=$SITE/torch/lib
echo "== torch $($PY -c 'import torch;print(torch.__version__, torch.version.cuda)') at $TL"
echo "== NEEDED / RUNPATH of libtorch_cuda.so"
readelf -d "$TL/libtorch_cuda.so" | grep -E 'NEEDED|RUNPATH|RPATH'
echo "== nvidia libraries"
ls "$SITE"/nvidia/*/lib 2>/dev/null | head -60
ls -d "$SITE"/nvidia/*/include 2>/dev/null
echo "== imports of torch's libraries from the CUDA libraries (file version name)"
for f in "$TL"/*.so*; do
	objdump -T "$f" 2>/dev/null | grep '\*UND\*' | awk -v f="$(basename "$f")" '{n=$NF; v=$(NF-1); if (n ~ /^(__cuda|cuda|cublas|cudnn|nvrtc|nccl|cusparse|cufft|curand|cusolver|nvJit|cuTensor|cu[A-Z])/) print f, v, n}'
done | sort -u >"$O/torch-imports.txt"
awk '{print $2}' "$O/torch-imports.txt" | sort | uniq -c
echo "== cupy's imports"
CP=$($PY -c 'import cupy,os;print(os.path.dirname(cupy.__file__))' 2>/dev/null)
CPB=$($PY -c 'import cupy_backends,os;print(os.path.dirname(cupy_backends.__file__))' 2>/dev/null)
for f in $(find "$CP" "$CPB" -name '*.so' 2>/dev/null); do
	objdump -T "$f" 2>/dev/null | grep '\*UND\*' | awk -v f="$(basename "$f")" '{n=$NF; v=$(NF-1); if (n ~ /^(__cuda|cuda|cublas|nvrtc|curand|cu[A-Z])/) print f, v, n}'
done | sort -u >"$O/cupy-imports.txt"
awk '{print $2}' "$O/cupy-imports.txt" | sort | uniq -c
echo "== version nodes of libcudart.so.13, libcublas.so.13, libcublasLt.so.13"
for l in cuda_runtime/lib/libcudart.so.13 cublas/lib/libcublas.so.13 cublas/lib/libcublasLt.so.13; do
	f=$(ls "$SITE"/nvidia/$l "$SITE"/nvidia/cu13/lib/$(basename $l) 2>/dev/null | head -1)
	echo "-- $f"
	[ -n "$f" ] && readelf -V "$f" | grep -A12 'Version definition' | head -14
	[ -n "$f" ] && objdump -T "$f" | grep -c ' DF .text'
done
echo "== nvcc's host code for a kernel, a __device__ variable and a launch"
T=$(mktemp -d)
cat >"$T/k.cu" <<'CU'
__device__ int dv[4];
__constant__ float cv;
__global__ void kern(int *p, float f, double d) { p[threadIdx.x] = (int)(f + d) + dv[0] + (int)cv; }
int main() { int *p; cudaMalloc(&p, 64); kern<<<1, 4>>>(p, 1.0f, 2.0); return cudaDeviceSynchronize(); }
CU
(cd "$T" && "$NVCC" -arch=sm_90 --cuda k.cu -o k.ii && grep -n '__cuda\|cudaLaunch\|__fatbinwrap\|__nv_' k.ii | grep -v '^.*#' | head -60)
(cd "$T" && "$NVCC" -arch=sm_90 -cudart shared -o k k.cu && objdump -T k | grep UND | grep -i cuda)
(cd "$T" && "$NVCC" -arch=sm_90 -cudart shared -Xcompiler -fPIC -shared -o libk.so k.cu && objdump -s -j .nvFatBinSegment libk.so | head -8 && objdump -h libk.so | grep -i nv)
echo "== headers packed"
(cd "$INC" && tar czf "$O/cuda-headers.tgz" cuda_runtime_api.h driver_types.h vector_types.h library_types.h crt/host_runtime.h fatbinary_section.h cuda_runtime.h crt/host_defines.h cublas_api.h cublasLt.h cublas_v2.h 2>&1 | tail -3)
ls -la "$O"
