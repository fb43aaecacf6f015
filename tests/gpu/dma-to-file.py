#!/usr/bin/env python3
"""Can GPU copies go straight into image files on a tmpfs, with no CPU copy?

    python3 tests/gpu/dma-to-file.py [--dir /dev/shm] [--gb 4] [--piece-mib 64]

Maps a file of DIR (MAP_SHARED), pins it for the GPU with cuMemHostRegister
and copies device memory into it and back. Prints, per case, the time to
prepare the file (ftruncate only or fallocate), to register it (whole, or in
pieces of --piece-mib MiB, as a dump writing a file per piece would), and
the copy rates, beside the same copies through an ordinary pinned buffer
(cuMemHostAlloc: the PCIe floor) measured in the same run. It checks the
bytes read back through the file equal what the GPU held.
"""
import argparse
import ctypes
import mmap
import os
import sys
import time

import torch


def cu():
    lib = ctypes.CDLL("libcuda.so.1")

    def call(name, *args):
        rc = getattr(lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name}: CUresult {rc}")

    return lib, call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--gb", type=float, default=4)
    ap.add_argument("--piece-mib", type=int, default=64)
    a = ap.parse_args()
    size = int(a.gb * (1 << 30)) // (64 << 20) * (64 << 20)
    piece = a.piece_mib << 20
    torch.cuda.init()
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev.random_(0, 256)
    torch.cuda.synchronize()
    lib, call = cu()
    dptr = ctypes.c_uint64(dev.data_ptr())
    rows = []

    def rate(sec):
        return f"{size / sec / 1e9:.1f}"

    # The floor: one pinned buffer of the same size.
    hp = ctypes.c_void_p()
    call("cuMemHostAlloc", ctypes.byref(hp), ctypes.c_size_t(size), 0)
    best_d2h = best_h2d = 1e9
    for _ in range(3):
        t = time.perf_counter()
        call("cuMemcpyDtoH_v2", hp, dptr, ctypes.c_size_t(size))
        best_d2h = min(best_d2h, time.perf_counter() - t)
        t = time.perf_counter()
        call("cuMemcpyHtoD_v2", dptr, hp, ctypes.c_size_t(size))
        best_h2d = min(best_h2d, time.perf_counter() - t)
    call("cuMemFreeHost", hp)
    rows.append(("pinned buffer (floor)", "-", "-", rate(best_d2h), rate(best_h2d), "-"))

    for prep in ("ftruncate", "fallocate"):
        for whole in (True, False):
            path = os.path.join(a.dir, f"gpucr-dma-probe-{os.getpid()}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                t = time.perf_counter()
                if prep == "fallocate":
                    os.posix_fallocate(fd, 0, size)
                else:
                    os.ftruncate(fd, size)
                t_prep = time.perf_counter() - t
                m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                base = ctypes.addressof(ctypes.c_char.from_buffer(m))
                spans = [(base, size)] if whole else [(base + o, min(piece, size - o)) for o in range(0, size, piece)]
                t = time.perf_counter()
                for p, n in spans:
                    call("cuMemHostRegister_v2", ctypes.c_void_p(p), ctypes.c_size_t(n), 0)
                t_reg = time.perf_counter() - t
                t = time.perf_counter()
                for p, n in spans:
                    call("cuMemcpyDtoH_v2", ctypes.c_void_p(p), ctypes.c_uint64(dptr.value + p - base), ctypes.c_size_t(n))
                t_d2h = time.perf_counter() - t
                t = time.perf_counter()
                for p, n in spans:
                    call("cuMemcpyHtoD_v2", ctypes.c_uint64(dptr.value + p - base), ctypes.c_void_p(p), ctypes.c_size_t(n))
                t_h2d = time.perf_counter() - t
                t = time.perf_counter()
                for p, _ in spans:
                    call("cuMemHostUnregister", ctypes.c_void_p(p))
                t_unreg = time.perf_counter() - t
                # What the file holds is what the GPU holds.
                sample = torch.frombuffer(m, dtype=torch.uint8)
                same = bool(torch.equal(sample[: 64 << 20], dev[: 64 << 20].cpu())) and bool(
                    torch.equal(sample[-(64 << 20):], dev[-(64 << 20):].cpu()))
                del sample
                m.close()
                how = "whole" if whole else f"{a.piece_mib} MiB pieces"
                rows.append((f"{prep}, registered {how}", f"{t_prep * 1e3:.0f} ms", f"{t_reg * 1e3:.0f} ms / {t_unreg * 1e3:.0f} ms",
                             rate(t_d2h), rate(t_h2d), "same" if same else "DIFFERENT"))
                end_to_end = t_prep + t_reg + t_d2h + t_unreg
                rows.append((f"  = dump into the file end to end", "", "", rate(end_to_end), "", ""))
            finally:
                os.close(fd)
                os.unlink(path)

    fs = os.popen(f"findmnt -no FSTYPE,OPTIONS -T {a.dir}").read().strip()
    print(f"{torch.cuda.get_device_name()}: {size / 1e9:.2f} GB, files in {a.dir} ({fs}); GB/s = 1e9 bytes/s\n")
    print("| case | prepare file | register / unregister | GPU->file GB/s | file->GPU GB/s | bytes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    sys.exit(main())
