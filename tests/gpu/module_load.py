"""Time cuModuleLoadData of a PTX module, as an application under gpucr run
pays it: the driver's JIT, and the interposer's request for the helper's
analysis of the PTX (AnalyzeModule) after it.

    python3 tests/gpu/module_load.py [N]

Loads heartbeat's PTX (from tests/apps/common/hbptx.c) N times (default 50),
unloading each, and prints the median and the minimum in milliseconds."""
import ast
import ctypes
import os
import re
import statistics
import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
src = open(os.path.join(os.path.dirname(__file__), "../apps/common/hbptx.c")).read()
body = src[src.index("const char gpuapp_hb_ptx[] ="):]
body = body[: body.index(";\n")]
body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
ptx = "".join(ast.literal_eval(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"', body)).encode() + b"\0"

cu = ctypes.CDLL("libcuda.so.1")
def check(r, what):
    if r != 0:
        sys.exit(f"{what}: CUresult {r}")
check(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
image = ctypes.create_string_buffer(ptx, len(ptx))
times = []
for _ in range(n):
    mod = ctypes.c_void_p()
    t = time.perf_counter()
    check(cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    times.append((time.perf_counter() - t) * 1e3)
    check(cu.cuModuleUnload(mod), "cuModuleUnload")
print(f"cuModuleLoadData of a {len(ptx)}-byte PTX module, {n} loads: median {statistics.median(times):.3f} ms, "
      f"min {min(times):.3f} ms")
