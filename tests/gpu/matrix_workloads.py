"""Real GPU programs for the workload matrix (tests/gpu/matrix.sh).

    python3 matrix_workloads.py WORKLOAD OUTFILE STEPS

Each workload prints `ready pid=PID` once set up, then one line per step,
`step I VALUES...` (losses, tokens, sums: full precision), and `done` after
the last. Every value depends only on the workload and the step, never on
timing, so a run that was checkpointed and restored in the middle must print
exactly the lines of an uninterrupted run: the matrix checks that, after
checking that two plain runs print the same. MATRIX_DELAY (seconds, default
0) sleeps between steps, so that a checkpoint lands mid-run.

Determinism: fixed seeds, torch.use_deterministic_algorithms (with
CUBLAS_WORKSPACE_CONFIG set by matrix.sh), the math attention backend, eager
attention in transformers, XLA's deterministic ops without autotuning, CuPy
without CUB.
"""
import os
import sys
import time

WORKLOAD, OUT, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
DELAY = float(os.environ.get("MATRIX_DELAY", "0"))
log = open(OUT, "a", buffering=1)


def emit(i, *vals):
    log.write(f"step {i} " + " ".join(v if isinstance(v, str) else repr(v) for v in vals) + "\n")
    if DELAY:
        time.sleep(DELAY)


def ready():
    log.write(f"ready pid={os.getpid()} workload={WORKLOAD}\n")


def done():
    log.write("done\n")


def torch_setup():
    import torch
    torch.manual_seed(0)
    # warn_only: an op without a deterministic version warns instead of
    # failing; the matrix compares two plain runs first in any case
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)
    return torch


def mlp(torch, d_in, d_hidden, d_out):
    import torch.nn as nn
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden), nn.GELU(),
                         nn.Linear(d_hidden, d_out)).cuda()


def train_dataloader():
    """Training fed by a DataLoader with 2 forked workers and pinned memory."""
    torch = torch_setup()
    import torch.utils.data as tud

    class Synthetic(tud.Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            x = torch.randn(64, generator=g)
            return x, x[:8].sum().unsqueeze(0)

    m = mlp(torch, 64, 512, 1)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    dl = tud.DataLoader(Synthetic(), batch_size=64, num_workers=2, pin_memory=True, persistent_workers=True)
    ready()
    for i, (x, y) in enumerate(dl):
        if i >= STEPS:
            break
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = ((m(x) - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        emit(i, loss.item())


def train_plain():
    """Training on data made on the GPU (no workers)."""
    torch = torch_setup()
    m = mlp(torch, 128, 1024, 16)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda")
    ready()
    for i in range(STEPS):
        g.manual_seed(i)
        x = torch.randn(256, 128, device="cuda", generator=g)
        loss = (m(x) - x[:, :16]).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        emit(i, loss.item())


def compiled():
    """torch.compile (Inductor, Triton kernels) forward and backward."""
    torch = torch_setup()
    m = mlp(torch, 256, 512, 256)
    cm = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda")
    ready()
    for i in range(STEPS):
        g.manual_seed(i)
        x = torch.randn(128, 256, device="cuda", generator=g)
        loss = (cm(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        emit(i, loss.item())


def cuda_graph():
    """A captured CUDA graph replayed every step; its output feeds its input."""
    torch = torch_setup()
    m = mlp(torch, 512, 1024, 512).eval()
    static_x = torch.randn(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(3):
            m(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y = m(static_x)
    torch.manual_seed(1)
    static_x.copy_(torch.randn(64, 512, device="cuda"))
    ready()
    for i in range(STEPS):
        graph.replay()
        with torch.no_grad():
            static_x.copy_(torch.tanh(static_y) + 0.001 * i)
        emit(i, static_y.double().sum().item())


def streams():
    """Matrix products on three streams ordered by events."""
    torch = torch_setup()
    a = torch.randn(1024, 1024, device="cuda") / 32
    b = torch.randn(1024, 1024, device="cuda") / 32
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ready()
    for i in range(STEPS):
        e = torch.cuda.Event()
        e.record()
        s1.wait_event(e)
        s2.wait_event(e)
        with torch.cuda.stream(s1):
            c1 = a @ b
        with torch.cuda.stream(s2):
            c2 = b @ a
        torch.cuda.current_stream().wait_stream(s1)
        torch.cuda.current_stream().wait_stream(s2)
        c1.record_stream(torch.cuda.current_stream())
        c2.record_stream(torch.cuda.current_stream())
        a = torch.tanh(c1 + 0.5 * c2 + 0.001 * i)
        b = torch.tanh(c2 - 0.5 * c1)
        emit(i, a.double().sum().item(), b.double().sum().item())


def kv_cache():
    """A transformer (GPT-2 architecture, seeded random weights) generating
    tokens one at a time with its KV cache."""
    torch = torch_setup()
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=8192, n_positions=2048, n_embd=256, n_layer=4, n_head=4, attn_implementation="eager")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).cuda().eval()
    ids = torch.tensor([[11, 22, 33, 44, 55, 66, 77, 88]], device="cuda")
    past = None
    ready()
    with torch.no_grad():
        for i in range(STEPS):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
            tok = int(logits.argmax())
            # the next token stays in the seeded vocabulary's well-spread part
            ids = torch.tensor([[tok]], device="cuda")
            emit(i, tok, logits.double().sum().item())


def jax_train():
    """JAX: a jitted MLP training step."""
    import jax
    import jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = {"w1": jax.random.normal(k1, (128, 512)) / 12, "w2": jax.random.normal(k2, (512, 16)) / 24}

    def loss_fn(p, x):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - x[:, :16]) ** 2)

    @jax.jit
    def step(p, x):
        loss, grads = jax.value_and_grad(loss_fn)(p, x)
        return jax.tree_util.tree_map(lambda a, g: a - 1e-2 * g, p, grads), loss

    ready()
    for i in range(STEPS):
        x = jax.random.normal(jax.random.fold_in(key, i), (256, 128))
        params, loss = step(params, x)
        emit(i, float(loss))


def cupy_loop():
    """CuPy: elementwise kernels and reductions on a 4 M-element state."""
    import cupy as cp
    rs = cp.random.RandomState(0)
    x = rs.random_sample(1 << 22, dtype=cp.float64)
    mix = cp.ElementwiseKernel("float64 x, float64 k", "float64 y", "y = sin(x * 1.0001 + k) * 0.5 + 0.5", "gpucr_mix")
    ready()
    for i in range(STEPS):
        x = mix(x, cp.float64(i * 1e-3))
        emit(i, float(x.sum()), float((x * x).mean()))


def ipc():
    """CUDA IPC of a tensor's memory (what torch.multiprocessing does to share
    a CUDA tensor with another process)."""
    torch = torch_setup()
    t = torch.ones(1 << 20, device="cuda")
    ready()
    try:
        t.untyped_storage()._share_cuda_()
        emit(0, "shared")
    except Exception as e:  # what the application sees
        emit(0, "refused", repr(str(e).splitlines()[0]))


WORKLOADS = {
    "train_dataloader": train_dataloader,
    "train_plain": train_plain,
    "compile": compiled,
    "cuda_graph": cuda_graph,
    "streams": streams,
    "kv_cache": kv_cache,
    "jax": jax_train,
    "cupy": cupy_loop,
    "ipc": ipc,
}

WORKLOADS[WORKLOAD]()
done()
