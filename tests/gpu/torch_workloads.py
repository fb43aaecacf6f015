"""PyTorch workloads for the interposer checks on the GPU machine.

    python3 torch_workloads.py WORKLOAD [--steps N] [--json]

WORKLOAD: resnet (ResNet-18 training, bf16 autocast, SGD), transformer
(TransformerEncoder training with SDPA, AdamW), inference (the same encoder,
eval, no_grad, bigger batch), compile (a torch.compile'd function, Triton).
Deterministic: fixed seeds, deterministic algorithms where PyTorch has them,
synthetic data generated on the GPU. Prints one line per step:

    step I LOSS STEP_SECONDS

and at the end `summary WORKLOAD median_step_s=... allocs=...`. Run with and
without `gpucr run` and compare the LOSS columns (bit-identical is expected:
the interposer changes where memory comes from, never what is computed) and
the step times (the overhead benchmark, tests/gpu/bench-interposer.sh).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def seed_all(seed):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def resnet18(num_classes=100):
    # Built here (torchvision may be missing): the ResNet-18 layout, basic blocks.
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def run_resnet(steps):
    model = resnet18().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(64, 3, 128, 128, device="cuda", generator=g).to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (64,), device="cuda", generator=g)
    for i in range(steps):
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        v = loss.item()
        yield i, v, time.perf_counter() - t


def encoder(d=512, layers=4):
    layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def run_transformer(steps):
    model = encoder().cuda()
    head = nn.Linear(512, 1000).cuda()
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(16, 256, 512, device="cuda", generator=g)
    y = torch.randint(0, 1000, (16, 256), device="cuda", generator=g)
    for i in range(steps):
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = head(model(x))
            loss = F.cross_entropy(out.float().view(-1, 1000), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        v = loss.item()
        yield i, v, time.perf_counter() - t


def run_inference(steps):
    model = encoder().cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(64, 256, 512, device="cuda", generator=g)
    with torch.no_grad():
        for i in range(steps):
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x + 0.001 * i)
            v = out.float().square().mean().item()
            yield i, v, time.perf_counter() - t


def run_compile(steps):
    @torch.compile
    def f(a, b):
        return torch.sin(a) * torch.cos(b) + (a @ b).relu()

    g = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(1024, 1024, device="cuda", generator=g)
    b = torch.randn(1024, 1024, device="cuda", generator=g)
    for i in range(steps):
        t = time.perf_counter()
        out = f(a + i, b)
        v = out.sum().item()
        yield i, v, time.perf_counter() - t


WORKLOADS = {"resnet": run_resnet, "transformer": run_transformer, "inference": run_inference, "compile": run_compile}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=sorted(WORKLOADS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median step time")
    args = p.parse_args()
    seed_all(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    times = []
    for i, loss, dt in WORKLOADS[args.workload](args.steps):
        print(f"step {i} {loss!r} {dt:.6f}", flush=True)
        if i >= args.warmup:
            times.append(dt)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    print(json.dumps({"summary": args.workload, "median_step_s": statistics.median(times) if times else None,
                      "allocs": stats.get("num_alloc_retries", 0) + stats.get("segment.all.allocated", 0),
                      "segments": stats.get("segment.all.current", 0),
                      "reserved_bytes": torch.cuda.memory_reserved(),
                      "gpucr": "LD_PRELOAD" in os.environ and "libgpucr" in os.environ["LD_PRELOAD"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
