"""A kernel loaded as PTX, as a CuPy program compiles one for a virtual
architecture (RawKernel, -arch=compute_XX): the driver JIT-compiles it at
cuModuleLoadData, and under gpucr run the interposer sends the image to the
helper for its analysis (AnalyzeModule).

    python3 tests/gpu/ptx_kernel.py STEPS

Prints "ready pid=PID", then "hb STEP CHECKSUM" for every step (a step
writes through one pointer parameter and reads another), then waits for a
line on stdin (so that its stats can be asked for) and prints "done"."""
import os
import sys

import cupy as cp

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
major = cp.cuda.Device(0).compute_capability[:-1]
src = r'''
extern "C" __global__ void mix(double *out, const double *in, double k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sin(in[i] * 1.0001 + k) * 0.5 + 0.5;
}
'''
mod = cp.RawModule(code=src, options=(f"-arch=compute_{major}0",), backend="nvrtc")
mix = mod.get_function("mix")
n = 1 << 22
a = cp.random.RandomState(0).random_sample(n, dtype=cp.float64)
b = cp.empty_like(a)
print(f"ready pid={os.getpid()} arch=compute_{major}0", flush=True)
for i in range(steps):
    mix(((n + 255) // 256,), (256,), (b, a, cp.float64(i * 1e-3), cp.int32(n)))
    a, b = b, a
    print(f"hb {i} {float(a.sum()):.12e}", flush=True)
sys.stdin.readline()
print("done", flush=True)
