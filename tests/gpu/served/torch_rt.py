"""PyTorch on served mode's runtime: work that needs only the CUDA runtime and
PyTorch's own kernels (elementwise, reductions, sort, scans, indexing, a CUDA
graph), then, with --matmul, a matrix product (cuBLAS), with --linear a linear
layer with its bias and its backward pass in float32 and bfloat16 (cuBLASLt's
product with a bias epilogue, cuBLAS's gemm), and with --compile the
elementwise step through torch.compile (Triton's kernels, loaded through the
driver API). Prints "ready", a
heartbeat line per step and "done checksum=..." (the same on any runtime).

    python3 torch_rt.py [--mib N] [--steps N] [--interval-ms N] [--matmul] [--linear] [--graph] [--compile]
"""
import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--mib", type=int, default=64)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--interval-ms", type=int, default=0)
ap.add_argument("--matmul", action="store_true")
ap.add_argument("--linear", action="store_true", help="a linear layer's forward and backward, float32 and bfloat16")
ap.add_argument("--graph", action="store_true")
ap.add_argument("--compile", action="store_true", help="the step's elementwise work through torch.compile (Triton)")
a = ap.parse_args()

dev = torch.device("cuda")
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0), flush=True)
g = torch.Generator(device=dev).manual_seed(1234)
n = a.mib * (1 << 20) // 4
x = torch.rand(n, device=dev, generator=g)
idx = torch.randint(0, n, (4096,), device=dev, generator=g)
w = torch.rand(256, 256, device=dev, generator=g) if a.matmul else None
static = torch.zeros(4096, device=dev)
lin = None
if a.linear:
    lin = torch.nn.Linear(512, 384, device=dev)
    with torch.no_grad():
        lin.weight.copy_(torch.rand(384, 512, device=dev, generator=g) - 0.5)
        lin.bias.copy_(torch.rand(384, device=dev, generator=g) - 0.5)
    xin = torch.rand(64, 512, device=dev, generator=g)
graph = None
if a.graph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        static.add_(1)  # warm up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.mul_(0.5).add_(torch.sin(static))
torch.cuda.synchronize()
print("ready", flush=True)
total = 0.0
def advance(x):
    return torch.remainder(x * 1.0001 + torch.sin(x) * 0.01, 1.0)


if a.compile:
    advance = torch.compile(advance)
for step in range(1, a.steps + 1):
    x = advance(x)
    s = x.double().sum().item()
    v, _ = torch.sort(x[idx])
    c = torch.cumsum(v, 0)[-1].item()
    m = x.max().item()
    total = (total * 0.5 + s + c + m) % 1e9
    if w is not None:
        y = w @ w.t()
        total += y.double().sum().item() * 1e-6
    if lin is not None:
        out = lin(xin)
        out.square().mean().backward()
        with torch.no_grad():
            lin.weight -= 1e-3 * lin.weight.grad
            lin.bias -= 1e-3 * lin.bias.grad
        lin.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = lin(xin)
        total += out.double().sum().item() * 1e-3 + half.double().sum().item() * 1e-3
    if graph is not None:
        graph.replay()
        total += static.double().sum().item() * 1e-3
    print(f"hb {step} {total:.6f}", flush=True)
    if a.interval_ms:
        time.sleep(a.interval_ms / 1000)
print(f"done checksum={total:.6f}", flush=True)
