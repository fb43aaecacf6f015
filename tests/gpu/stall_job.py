"""A GPU job whose every step is timed, for seeing a checkpoint's stall as the
application sees it (tests/gpu/bench-concurrent.sh).

    python3 stall_job.py GB LOG [--train]

Holds GB of random int32 tensors in 256 MB buffers. Each step rewrites one
buffer (the next in turn: every chunk changes within GB * 4 steps) with a
linear congruential step per element (x = x * 1664525 + 1013904223, wrapping:
the contents never settle and no two chunks become equal, unlike an update
that converges), adds a little of it to a float64 accumulator and
synchronizes, then sleeps 2 ms.
LOG gets "ready pid=N", then "st I T" for every step (T: time.time() at its
end) and "hb I T ACC" every 20 steps; ACC is deterministic, so a restored
process must print, for each iteration, the ACC the original printed.

--hot=N: only the first N buffers are rewritten, the rest hold still (an
inference server's weights beside its cache, say).

--train instead trains a transformer language model (12 layers, hidden 1536,
AdamW, bf16 autocast, batch 8 x 256, about 11 GB with its optimizer state) on
synthetic tokens from a DataLoader with 2 worker processes; ACC is then the
running sum of the losses. --train-small: the same with 6 layers of hidden
768 (about 1.5 GB). Seeded, and deterministic on one GPU, so a
restored process must repeat the losses.

--show-device appends to every hb line what the process finds of its device
0 at that moment: torch's cached properties (uuid), and the driver and NVML
asked afresh (libcuda's UUID and PCI bus id of the ordinal; the bus id as
an application calling the driver API gets it, through gpucr's interposer
under gpucr run; the UUID NVML gives for that bus id): after a restore onto
another GPU they tell which answers follow the move.
"""
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from bench_steps import LM, Tokens  # noqa: E402  (this directory: the same model as the step benchmark's)


class DeviceProbe:
    """Asks the driver and NVML directly (ctypes): torch caches what it read once."""

    def __init__(self):
        import ctypes
        self.c = ctypes
        self.cu = ctypes.CDLL("libcuda.so.1")
        # As an application calling the driver API finds it (the interposer's
        # entry points under gpucr run), next to libcuda's own.
        glob = ctypes.CDLL(None)
        self.app = glob if hasattr(glob, "cuDeviceGetPCIBusId") else self.cu
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            self.nvml_ok = self.nvml.nvmlInit_v2() == 0
        except OSError:
            self.nvml_ok = False

    @staticmethod
    def fmt(b):
        h = bytes(b).hex()
        return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def report(self):
        c = self.c
        u = (c.c_ubyte * 16)()
        drv = self.fmt(u) if self.cu.cuDeviceGetUuid_v2(u, 0) == 0 else "?"
        bus = c.create_string_buffer(64)
        drv_bus = bus.value.decode() if self.cu.cuDeviceGetPCIBusId(bus, 64, 0) == 0 else "?"
        bus = c.create_string_buffer(64)
        bus_id = bus.value.decode() if self.app.cuDeviceGetPCIBusId(bus, 64, 0) == 0 else "?"
        nv = "?"
        if self.nvml_ok and bus_id != "?":
            h = c.c_void_p()
            if self.nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.value, c.byref(h)) == 0:
                s = c.create_string_buffer(96)
                if self.nvml.nvmlDeviceGetUUID(h, s, 96) == 0:
                    nv = s.value.decode()
        tu = str(getattr(torch.cuda.get_device_properties(0), "uuid", "?"))
        if tu != "?" and not tu.startswith("GPU-"):
            tu = "GPU-" + tu
        return f" torch_uuid={tu} drv_uuid={drv} drv_bus={drv_bus} app_bus={bus_id} nvml_uuid_of_app_bus={nv}"


PROBE = None


def show():
    return PROBE.report() if PROBE else ""


def buffers_job(gb, log, hot=0):
    g = torch.Generator(device="cuda")
    g.manual_seed(1)
    n = max(1, int(gb * 4))
    bufs = [torch.randint(-(1 << 31), (1 << 31) - 1, (64 << 20,), device="cuda", generator=g, dtype=torch.int32)
            for _ in range(n)]
    acc = torch.zeros(1, device="cuda", dtype=torch.float64)
    torch.cuda.synchronize()
    log.write(f"ready pid={os.getpid()} bufs={n}\n")
    i = 0
    while True:
        k = i % (hot or n)
        bufs[k].mul_(1664525).add_(1013904223)
        acc += bufs[k][:4096].double().sum()
        torch.cuda.synchronize()
        t = time.time()
        log.write(f"st {i} {t:.4f}\n")
        if i % 20 == 0:
            log.write(f"hb {i} {t:.4f} {acc.item():.6f}{show()}\n")
        i += 1
        time.sleep(0.002)


def train_job(log, small=False):
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = (LM(d=768, layers=6) if small else LM()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=8, num_workers=2, shuffle=False)
    acc = 0.0
    log.write(f"ready pid={os.getpid()} params={sum(p.numel() for p in model.parameters())}\n")
    for i, batch in enumerate(loader):
        batch = batch.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        acc += loss.item()  # synchronizes
        t = time.time()
        log.write(f"st {i} {t:.4f}\n")
        if i % 5 == 0:
            log.write(f"hb {i} {t:.4f} {acc:.6f}{show()}\n")


def main():
    gb = float(sys.argv[1])
    log = open(sys.argv[2], "a", buffering=1)
    if "--show-device" in sys.argv[3:]:
        global PROBE
        torch.cuda.init()
        PROBE = DeviceProbe()
    if "--train" in sys.argv[3:]:
        train_job(log)
    elif "--train-small" in sys.argv[3:]:
        train_job(log, small=True)
    else:
        hot = [int(a.split("=", 1)[1]) for a in sys.argv[3:] if a.startswith("--hot=")]
        buffers_job(gb, log, hot[0] if hot else 0)


if __name__ == "__main__":
    main()
