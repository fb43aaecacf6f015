#!/usr/bin/env python3
"""gpucr's own kernels (ptx/kernels.ptx) on a real GPU, through the driver API
alone (ctypes on libcuda.so.1; no nvcc, no framework):

  python3 tests/gpu/ptx-check.py [--gb N]

1. The PTX loads (cuModuleLoadDataEx; the JIT's log is printed on failure).
2. gpucr_chunk_hash gives the pinned vectors of ptx/chunkhash_test.go (the
   hash's definition in Go, which the simulated driver matches in CI) for the
   same splitmix64 bytes, one launch per vector, and the same hashes again
   when those vectors are chunks of one launch.
3. gpucr_compare: equal ranges leave the flag alone, one flipped byte sets it.
4. Speed: N GB (default 8) hashed in 4 MiB chunks, timed with events, best of
   3, against a device-to-device copy of the same bytes (the memory's speed
   as the driver's own copy sees it).
Prints one line per check; exits non-zero on any difference.
"""
import ctypes as C
import os
import re
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GB = 8
if "--gb" in sys.argv:
    GB = float(sys.argv[sys.argv.index("--gb") + 1])

cu = C.CDLL("libcuda.so.1")
u64 = C.c_uint64


def ok(r, what):
    if r != 0:
        name = C.c_char_p()
        cu.cuGetErrorName(r, C.byref(name))
        raise SystemExit(f"FAIL: {what}: {name.value.decode() if name.value else r} ({r})")


ok(cu.cuInit(0), "cuInit")
dev = C.c_int()
ok(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ctx = C.c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
name = C.create_string_buffer(256)
cu.cuDeviceGetName(name, 256, dev)
print(f"device: {name.value.decode()}")

# 1. load, with the JIT's logs
ptx = open(os.path.join(ROOT, "ptx", "kernels.ptx"), "rb").read() + b"\0"
mod = C.c_void_p()
log = C.create_string_buffer(1 << 16)
info = C.create_string_buffer(1 << 16)
# CU_JIT_INFO_LOG_BUFFER 3, _SIZE_BYTES 4, CU_JIT_ERROR_LOG_BUFFER 5, _SIZE_BYTES 6
opts = (C.c_int * 4)(3, 4, 5, 6)
vals = (C.c_void_p * 4)(C.cast(info, C.c_void_p), C.c_void_p(len(info)), C.cast(log, C.c_void_p), C.c_void_p(len(log)))
if hasattr(cu, "cuModuleLoadDataEx"):
    r = cu.cuModuleLoadDataEx(C.byref(mod), ptx, 4, opts, vals)
else:  # the simulated driver (LD_LIBRARY_PATH=build/sim) has no JIT to log
    r = cu.cuModuleLoadData(C.byref(mod), ptx)
if r != 0:
    print("JIT error log:\n" + log.value.decode(errors="replace"))
    ok(r, "cuModuleLoadDataEx(ptx/kernels.ptx)")
print("load: ok" + (f" ({info.value.decode().strip()})" if info.value else ""))
fhash, fcmp = C.c_void_p(), C.c_void_p()
ok(cu.cuModuleGetFunction(C.byref(fhash), mod, b"gpucr_chunk_hash"), "cuModuleGetFunction(gpucr_chunk_hash)")
ok(cu.cuModuleGetFunction(C.byref(fcmp), mod, b"gpucr_compare"), "cuModuleGetFunction(gpucr_compare)")


def alloc(n):
    p = u64()
    ok(cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(n)), f"cuMemAlloc({n})")
    return p.value


def htod(dst, arr):
    ok(cu.cuMemcpyHtoD_v2(u64(dst), arr.ctypes.data_as(C.c_void_p), C.c_size_t(arr.nbytes)), "cuMemcpyHtoD")


def dtoh(arr, src):
    ok(cu.cuMemcpyDtoH_v2(arr.ctypes.data_as(C.c_void_p), u64(src), C.c_size_t(arr.nbytes)), "cuMemcpyDtoH")


def launch(f, grid, block, *args):
    a = [u64(x) for x in args]
    params = (C.c_void_p * len(a))(*[C.cast(C.byref(x), C.c_void_p) for x in a])
    ok(cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, None, params, None), "cuLaunchKernel")


TABLE = None


def hash_chunks(chunks, out):
    """One launch of gpucr_chunk_hash over chunks [(address, length)]."""
    global TABLE
    t = np.array([v for c in chunks for v in c], dtype=np.uint64)
    if TABLE is None:
        TABLE = alloc(1 << 20)
    htod(TABLE, t)
    launch(fhash, len(chunks), 256, TABLE, len(chunks), out)


def sync():
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def splitmix(seed, n):
    words = (n + 7) // 8
    i = np.arange(1, words + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").view(np.uint8)[:n].copy()


def hexof(words):
    return "".join(f"{int(w):016x}" for w in words)


fails = 0
# 2. the pinned vectors
src = open(os.path.join(ROOT, "ptx", "chunkhash_test.go")).read()
# (no bytes make no chunk: nothing for the GPU to hash)
vectors = [(int(s), int(n), h) for s, n, h in re.findall(r'\{(\d+), (\d+), "([0-9a-f]{32})"\}', src) if int(n) > 0]
if len(vectors) < 8:
    raise SystemExit(f"FAIL: only {len(vectors)} vectors found in ptx/chunkhash_test.go")
buf = alloc(16 << 20)
out = alloc(1 << 16)
res = np.zeros(2, dtype=np.uint64)
bad = []
for seed, n, want in vectors:
    data = splitmix(seed, n)
    if n:
        htod(buf, data)
    hash_chunks([(buf, n)], out)
    sync()
    dtoh(res, out)
    if hexof(res) != want:
        bad.append(f"seed {seed}, {n} bytes: GPU {hexof(res)}, want {want}")
print(f"vectors: {len(vectors) - len(bad)} of {len(vectors)} equal to ptx.ChunkHash" + "".join("\n  " + b for b in bad))
fails += len(bad)

# 16 chunks of 1 MiB in one launch (seed 8's bytes, then splitmix of seeds
# 100..114) against 16 launches of one chunk.
chunk = 1 << 20
blob = np.concatenate([splitmix(8, chunk)] + [splitmix(100 + i, chunk) for i in range(15)])
htod(buf, blob)
many = np.zeros(32, dtype=np.uint64)
hash_chunks([(buf + i * chunk, chunk) for i in range(16)], out)
sync()
dtoh(many, out)
single_bad = 0
for i in range(16):
    hash_chunks([(buf + i * chunk, chunk)], out)
    sync()
    dtoh(res, out)
    single_bad += int(hexof(res) != hexof(many[2 * i:2 * i + 2]))
want8 = [h for s, n, h in vectors if s == 8][0]
first_ok = hexof(many[0:2]) == want8
print(f"one launch of 16 chunks: {16 - single_bad} of 16 equal to single launches; chunk 0 {'equals' if first_ok else 'DIFFERS from'} the vector")
fails += single_bad + (0 if first_ok else 1)

# 3. compare
flag = np.zeros(1, dtype=np.uint32)
htod(out, flag)
launch(fcmp, 64, 256, buf, buf, 8 << 20, out)
sync()
dtoh(flag, out)
same = int(flag[0])
b2 = alloc(8 << 20)
ok(cu.cuMemcpyDtoD_v2(u64(b2), u64(buf), C.c_size_t(8 << 20)), "cuMemcpyDtoD")
one = np.array([blob[5 << 20] ^ 1], dtype=np.uint8)
ok(cu.cuMemcpyHtoD_v2(u64(b2 + (5 << 20) + 7), one.ctypes.data_as(C.c_void_p), C.c_size_t(1)), "cuMemcpyHtoD")
htod(out, np.zeros(1, dtype=np.uint32))
launch(fcmp, 64, 256, buf, b2, 8 << 20, out)
sync()
dtoh(flag, out)
diff = int(flag[0])
print(f"compare: equal ranges -> {same} (want 0), one byte flipped -> {diff} (want 1)")
fails += int(same != 0) + int(diff != 1)

# 4. speed
n = int(GB * (1 << 30)) // chunk * chunk
big = alloc(n)
big2 = alloc(n)
ok(cu.cuMemsetD32_v2(u64(big), 0x5A5A5A5A, C.c_size_t(n // 4)), "cuMemsetD32")
outs = alloc(16 * (n // chunk))
e0, e1 = C.c_void_p(), C.c_void_p()
ok(cu.cuEventCreate(C.byref(e0), 0), "cuEventCreate")
ok(cu.cuEventCreate(C.byref(e1), 0), "cuEventCreate")


def timed(f):
    best = 1e9
    for _ in range(3):
        ok(cu.cuEventRecord(e0, None), "cuEventRecord")
        f()
        ok(cu.cuEventRecord(e1, None), "cuEventRecord")
        sync()
        ms = C.c_float()
        ok(cu.cuEventElapsedTime_v2(C.byref(ms), e0, e1), "cuEventElapsedTime")
        best = min(best, ms.value / 1e3)
    return best


bigtable = [(big + i * chunk, chunk) for i in range(n // chunk)]
th = timed(lambda: hash_chunks(bigtable, outs))
tc = timed(lambda: ok(cu.cuMemcpyDtoD_v2(u64(big2), u64(big), C.c_size_t(n)), "cuMemcpyDtoD"))
print(f"speed: {n / 1e9:.2f} GB hashed in {th * 1e3:.2f} ms ({n / th / 1e9:.0f} GB/s); "
      f"device-to-device copy {tc * 1e3:.2f} ms ({2 * n / tc / 1e9:.0f} GB/s read+write); "
      f"hash reads at {n / th / (2 * n / tc):.2f}x the copy's traffic rate")
print("result: " + ("pass" if fails == 0 else f"FAIL ({fails})"))
sys.exit(1 if fails else 0)
