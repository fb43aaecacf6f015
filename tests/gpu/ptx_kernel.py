"""A kernel loaded as PTX text: compiled by NVRTC for a virtual architecture
(-arch=compute_XX) and handed to cuModuleLoadData (CuPy's Module.load), as
programs that ship PTX do. The driver JIT-compiles it, and under gpucr run
the interposer sends the image to the helper for its analysis
(AnalyzeModule). (CuPy's own RawModule links PTX into a cubin first, with
cuLink*: the driver then loads SASS, which needs no analysis.)

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
from cupy.cuda import function, nvrtc

prog = nvrtc.createProgram(src, "mix.cu", [], [])
nvrtc.compileProgram(prog, [f"-arch=compute_{major}0"])
ptx = nvrtc.getPTX(prog)
mod = function.Module()
mod.load(ptx if isinstance(ptx, bytes) else ptx.encode())
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
