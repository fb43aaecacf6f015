"""A 2-rank DDP training job, as people run them: torchrun, one process per
GPU, NCCL with its defaults, a DataLoader with worker processes.

    torchrun --nproc-per-node 2 tests/gpu/ddp.py OUTFILE STEPS
    DDP_SPAWN=2 python3 tests/gpu/ddp.py OUTFILE STEPS

With DDP_SPAWN=N the script starts its N ranks itself (torch.multiprocessing
spawn, rank 0 hosting the TCPStore: env:// rendezvous on a free local port),
as jobs launched without torchrun do.

Rank 0 writes `ready pid=PID` once the process group is up, one line per step,
`step I LOSS GRADNORM` (the loss averaged over the ranks with all_reduce, the
gradient norm after DDP's all_reduce; full precision), and `done`. With
DDP_TIMES=FILE rank 0 also appends each step's wall time there ("I SECONDS"),
for step-time tables. With DDP_WHERE=N every rank appends, every N steps,
`where STEP RANK PID BUS UUID` to OUTFILE.where: the PCI bus id and UUID
CUDA's driver API answers for its device (through the global symbol
table, so gpucr's interposer answers where it stands in), to see which GPU
a restored rank believes it is on. Every value
depends only on the step, so runs with and without gpucr must print the same
lines (tests/gpu/ddp.sh compares them). DDP_DELAY (seconds) sleeps between
steps. DDP_GRAPH=1 adds, each step, an all_reduce captured once into a CUDA
graph and replayed (as frameworks replay NCCL's collectives in graphs): of the
step's loss and gradient norm, each rank's own, whose sums end the step line.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

OUT, STEPS = sys.argv[1], int(sys.argv[2])
DELAY = float(os.environ.get("DDP_DELAY", "0"))
TIMES = os.environ.get("DDP_TIMES")
WHERE = int(os.environ.get("DDP_WHERE", "0"))
GRAPH = os.environ.get("DDP_GRAPH") == "1"


def where(dev):
    """The PCI bus id and UUID the driver API answers for ordinal dev: the
    process's own symbols first (gpucr's interposer, where it is preloaded,
    as the application's calls find it), else libcuda's."""
    import ctypes

    def fn(name):
        for lib in (None, "libcuda.so.1"):
            try:
                return getattr(ctypes.CDLL(lib), name)
            except (AttributeError, OSError):
                pass
        return None

    bus, u = ctypes.create_string_buffer(32), ctypes.create_string_buffer(16)
    get_bus, get_uuid = fn("cuDeviceGetPCIBusId"), fn("cuDeviceGetUuid_v2")
    b = bus.value.decode() if get_bus and get_bus(bus, 32, dev) == 0 else "?"
    if not get_uuid or get_uuid(u, dev) != 0:
        return f"{b} ?"
    h = u.raw.hex()
    return f"{b} GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Synthetic(Dataset):
    """Inputs and targets made from the index alone, so every run sees the same data."""

    def __len__(self):
        return 1 << 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(256, generator=g)
        return x, (x[:16] * 0.5).sin()


def main():
    dist.init_process_group("nccl")
    run()


def spawned(local, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local), LOCAL_RANK=str(local),
                      WORLD_SIZE=str(world))
    main()


def run():
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                          nn.Linear(1024, 16)).cuda()
    ddp = DDP(model, device_ids=[local])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    sampler = DistributedSampler(Synthetic(), num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(Synthetic(), batch_size=64, sampler=sampler, num_workers=2, persistent_workers=True)
    log = open(OUT, "a", buffering=1) if rank == 0 else None
    if log:
        log.write(f"ready pid={os.getpid()} world={world}\n")
    times = open(TIMES, "a", buffering=1) if rank == 0 and TIMES else None
    wlog = open(OUT + ".where", "a", buffering=1) if WHERE else None
    graph = None
    if GRAPH:
        # NCCL's communicator is up (DDP's broadcast); captured once, from a
        # side stream, replayed each step
        gsum = torch.zeros(2, device="cuda")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            dist.all_reduce(gsum)
        torch.cuda.synchronize()
    step = 0
    epoch = 0
    last = time.perf_counter()
    while step < STEPS:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step >= STEPS:
                break
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1e9)
            opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            avg /= world
            gtxt = ""
            if graph:
                gsum.copy_(torch.stack([loss.detach() * (rank + 1), gnorm.detach() * (rank + 1)]))
                graph.replay()
                gtxt = " " + " ".join(repr(v) for v in gsum.tolist())
            if log:
                log.write(f"step {step} {avg.item()!r} {gnorm.item()!r}{gtxt}\n")
            if wlog and step % WHERE == 0:
                wlog.write(f"where {step} {rank} {os.getpid()} {where(local)}\n")
            if times:
                now = time.perf_counter()
                times.write(f"{step} {now - last:.6f}\n")
            step += 1
            if DELAY:
                time.sleep(DELAY)
            last = time.perf_counter()
        epoch += 1
    if log:
        log.write("done\n")
    if graph is not None:
        # a graph that holds NCCL's work goes before the communicator does:
        # left to the end, the ranks hung at their exit (2 x H200, torch 2.11)
        torch.cuda.synchronize()
        graph.reset()
        graph = None
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(os.environ.get("DDP_SPAWN", "0"))
    if n:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned, args=(n, port), nprocs=n)
    else:
        main()
