"""What in torchrun's agent holds io_uring and the GPU: runs torchrun's main
in this process with TCPStore and CUDA's initialisation wrapped, printing
who makes each store (with its arguments) and who first touches CUDA.

    python3 tests/gpu/torchrun_probe.py TRAIN_SCRIPT [TORCHRUN ARGS...]
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

_Store = dist.TCPStore


def _store(*a, **kw):
    print(f"probe: TCPStore{a} {kw} in pid {os.getpid()}", flush=True)
    traceback.print_stack(limit=8, file=sys.stdout)
    return _Store(*a, **kw)


dist.TCPStore = _store

for name in ("_cuda_getDeviceCount", "_cuda_init"):
    orig = getattr(torch._C, name, None)
    if orig is None:
        continue

    def wrapped(*a, _orig=orig, _name=name):
        print(f"probe: torch._C.{_name} in pid {os.getpid()}", flush=True)
        traceback.print_stack(limit=10, file=sys.stdout)
        return _orig(*a)

    setattr(torch._C, name, wrapped)

from torch.distributed.run import main  # noqa: E402

sys.argv = ["torchrun", *sys.argv[2:], sys.argv[1]]
main()
