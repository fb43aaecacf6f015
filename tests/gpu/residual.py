"""A CUDA process whose residual driver state (what NVIDIA's checkpoint API
saves besides the application's memory) tests/gpu/residual.sh measures.

    python3 residual.py MODE READYFILE

MODE: bare (a context and one tiny tensor), cublas (plus a cuBLAS matmul),
ops (plus many kinds of kernels: convolution, attention, norms, bf16 matmuls,
reductions), streams (ops, plus 64 streams), stack (ops, with the per-thread
stack limit lowered to 256 bytes after the kernels ran: the driver sizes its
local-memory reservation by it). The caching allocator's memory is given
back before READYFILE is written, so what remains is the driver's own.
Then it sleeps until killed.
"""
import ctypes
import sys
import time

import torch
import torch.nn.functional as F

mode, ready = sys.argv[1], sys.argv[2]
x = torch.zeros(1, device="cuda")
keep = []
if mode != "bare":
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
if mode in ("ops", "streams", "stack"):
    img = torch.randn(8, 64, 56, 56, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda")
    F.conv2d(img, w, padding=1).relu().sum().item()
    q = torch.randn(4, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).float().sum().item()
    h = torch.randn(64, 1024, device="cuda")
    F.layer_norm(h, (1024,)).softmax(-1).cumsum(-1).topk(5).values.sum().item()
    (h.bfloat16() @ h.bfloat16().T).float().logsumexp(-1).sum().item()
    torch.sort(torch.randn(1 << 20, device="cuda")).values[0].item()
if mode == "streams":
    keep = [torch.cuda.Stream() for _ in range(64)]
    for s in keep:
        with torch.cuda.stream(s):
            (x + 1).sum()
    torch.cuda.synchronize()
if mode == "stack":
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuCtxSetLimit(0, ctypes.c_size_t(256))  # CU_LIMIT_STACK_SIZE
    if rc != 0:
        print(f"cuCtxSetLimit: {rc}", file=sys.stderr)
torch.cuda.synchronize()
del keep
torch.cuda.empty_cache()
free, total = torch.cuda.mem_get_info()
open(ready, "w").write(f"used_mib={(total - free) >> 20}\n")
while True:
    time.sleep(1)
