"""Step times of real GPU work, for comparing a run under `gpucr run` with a
plain one (tests/gpu/bench-steps.sh runs them in interleaved pairs).

    python3 bench_steps.py WORKLOAD... [--steps N] [--warmup W]

One process runs the workloads named, one after the other (each's memory
given back before the next), so that a pair of processes compares them all.
WORKLOAD:
  lm_train     a launch-bound language-model training step: 12 layers, hidden
               1536, batch 16 x 256 tokens, bf16 autocast, AdamW, a DataLoader
               with 2 worker processes
  resnet50     a ResNet-50 training step, batch 64 at 224 x 224, bf16 autocast
  decode_b1    an LLM decode loop at batch 1 (12 layers, hidden 1024, a KV
               cache): one token a step, many tiny kernels
  graph        CUDA graph replay of a small MLP's forward and backward

Prints a JSON line per workload: {"workload", "steps", "times_ms": [...],
"median_ms", "last": a value of the last step (loss or token) that two runs
must share}. --steps scales each workload's own number of timed steps
(STEPS below: about 5 s of steps each on an H200).
"""
import argparse
import gc
import json
import os
import statistics
import time

import torch
import torch.nn as nn


def seed(s=0):
    torch.manual_seed(s)
    torch.cuda.manual_seed_all(s)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 32000, (257,), generator=g)


class LM(nn.Module):
    def __init__(self, vocab=32000, d=1536, layers=12, heads=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        n = x.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
        return self.head(self.body(self.emb(x), mask=mask, is_causal=True))


def lm_train():
    with torch.device("cuda"):  # initialised on the GPU: seconds less than on the CPU
        model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=16, num_workers=2, pin_memory=True,
                                         persistent_workers=True)
    it = iter(loader)

    def step():
        b = next(it).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(b[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def resnet50():
    import torchvision
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def decode_b1():
    d, layers, heads, vocab, ctx = 1024, 12, 16, 32000, 2048
    hd = d // heads
    emb = nn.Embedding(vocab, d).cuda().half()
    blocks = [nn.ModuleDict({"ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "o": nn.Linear(d, d),
                             "ln2": nn.LayerNorm(d), "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d)})
              .cuda().half() for _ in range(layers)]
    head = nn.Linear(d, vocab, bias=False).cuda().half()
    kc = torch.zeros(layers, heads, ctx, hd, device="cuda", dtype=torch.half)
    vc = torch.zeros_like(kc)
    state = {"pos": 0, "tok": torch.tensor([[1]], device="cuda")}

    @torch.no_grad()
    def step():
        p = state["pos"] % ctx
        h = emb(state["tok"])[:, 0]
        for i, b in enumerate(blocks):
            q, k, v = b["qkv"](b["ln1"](h)).view(3, heads, hd).unbind(0)
            kc[i, :, p] = k
            vc[i, :, p] = v
            att = torch.softmax((kc[i, :, :p + 1] @ q.unsqueeze(-1)).squeeze(-1) / hd ** 0.5, dim=-1)
            h = h + b["o"]((att.unsqueeze(1) @ vc[i, :, :p + 1]).reshape(1, d))
            h = h + b["down"](torch.nn.functional.gelu(b["up"](b["ln2"](h))))
        tok = head(h).argmax(-1, keepdim=True)
        state["tok"] = tok
        state["pos"] += 1
        return tok
    return step


def graph():
    model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()

    def step():
        g.replay()
        return loss
    return step


# Timed steps of each workload at --steps 100: the short steps get more, so
# that each is timed over a few seconds.
STEPS = {"lm_train": 100, "resnet50": 100, "decode_b1": 1000, "graph": 1000}


def run(workload, steps, warmup):
    seed()
    step = globals()[workload]()
    last = None
    for _ in range(warmup):
        last = step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        last = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"workload": workload, "steps": steps, "pid": os.getpid(), "times_ms": times,
                      "median_ms": statistics.median(times), "last": float(last.float().sum().item())}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", nargs="+", choices=sorted(STEPS))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-cudnn", action="store_true",
                    help="PyTorch's own kernels where it would call cuDNN (attention, convolutions): "
                         "what served mode runs, which does not forward cuDNN yet")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.no_cudnn:
        torch.backends.cudnn.enabled = False
        torch.backends.cuda.enable_cudnn_sdp(False)
    for w in a.workload:
        run(w, max(1, STEPS[w] * a.steps // 100), a.warmup)
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
