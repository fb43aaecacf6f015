# smaps_by_kind.py PID: a process's memory by what maps it, in MiB: Rss and
# the private dirty pages CRIU dumps (Private_Dirty, anonymous or not), one
# line per kind: the driver's libraries (libcuda, libnvidia-*), the CUDA
# libraries the application loads (cudart, cuBLAS, cuDNN, ...), the
# driver's device files (/dev/nvidia*), the heap, other anonymous memory,
# and the rest.
import re, sys
from collections import defaultdict

def kind(name):
    base = name.rsplit("/", 1)[-1]
    if base.startswith("libcuda.so") or base.startswith("libnvidia-"):
        return "driver-libs"
    if name.startswith("/dev/nvidia"):
        return "dev-nvidia"
    if re.match(r"lib(cudart|cublas|cublasLt|cudnn|cufft|curand|cusparse|cusolver|nccl|nvrtc|nvJitLink|cupti|nvToolsExt)", base):
        return "cuda-libs"
    if base.startswith("libtorch") or base.startswith("libc10") or "triton" in name:
        return "torch-libs"
    if name == "[heap]":
        return "heap"
    if name == "" or name.startswith("[anon") or name == "[stack]":
        return "anon"
    if name.startswith("/memfd:") or name.startswith("/dev/shm"):
        return "shm"
    return "other"

rss = defaultdict(int)
dirty = defaultdict(int)
cur = "other"
with open(f"/proc/{sys.argv[1]}/smaps") as f:
    for line in f:
        m = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$", line)
        if m:
            cur = kind(m.group(1).strip())
            continue
        if line.startswith("Rss:"):
            rss[cur] += int(line.split()[1])
        elif line.startswith("Private_Dirty:"):
            dirty[cur] += int(line.split()[1])
kinds = sorted(set(rss) | set(dirty), key=lambda k: -dirty[k])
print(" ".join(f"{k}={rss[k] / 1024:.0f}/{dirty[k] / 1024:.0f}" for k in kinds),
      f"total={sum(rss.values()) / 1024:.0f}/{sum(dirty.values()) / 1024:.0f}")
