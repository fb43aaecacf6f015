# The workload callprobe.sh watches: what a PyTorch job asks of the driver
# (PyTorch itself, cuBLAS, cuDNN, a CUDA graph, and with COMPILE=1 Triton's
# own launcher), then, with HOLD=1, it writes "ready pid=N" to argv[1] and
# waits, so that its memory can be read before and after NVIDIA's
# checkpoint parks the driver's state in it.
import os, sys, time
t0 = time.perf_counter()
import torch
t_import = time.perf_counter()

ready = sys.argv[1] if len(sys.argv) > 1 else None
torch.manual_seed(0)
dev = "cuda"
torch.zeros(1, device=dev)
torch.cuda.synchronize()
t_ctx = time.perf_counter()
a = torch.randn(1024, 1024, device=dev)
b = (a @ a).sum()  # cuBLAS
torch.cuda.synchronize()
t_blas = time.perf_counter()
conv = torch.nn.Conv2d(3, 16, 3).to(dev)
y = conv(torch.randn(8, 3, 64, 64, device=dev)).sum()  # cuDNN
torch.cuda.synchronize()
t_dnn = time.perf_counter()
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 512, device=dev)
for _ in range(3):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        model(x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = model(x)
g.replay()
if os.environ.get("COMPILE") == "1":
    f = torch.compile(lambda t: (t.sin() * 2 + t.cos()).sum())
    f(torch.randn(4096, device=dev))
torch.cuda.synchronize()
# What a pre-warmed worker would have done before the application asks.
print(f"startup: import {t_import - t0:.3f} s, context {t_ctx - t_import:.3f} s, cuBLAS {t_blas - t_ctx:.3f} s, "
      f"cuDNN {t_dnn - t_blas:.3f} s", flush=True)
print(f"done {b.item():.3f} {y.item():.3f} {out.sum().item():.3f}", flush=True)
if ready:
    with open(ready, "a") as f:
        f.write(f"ready pid={os.getpid()}\n")
    while True:
        time.sleep(0.5)
