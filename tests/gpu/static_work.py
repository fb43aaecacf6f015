# A GPU process whose memory changes only when told to: N GB of random bytes
# in 256 MB PyTorch tensors. Each line "change P SEED" appended to the file
# CMD changes one byte in P percent of its 4 MiB chunks (chosen by SEED);
# it then logs "changed K SUM" (K chunks; SUM a checksum of every tensor's
# first 4 KiB). For measuring incremental checkpoints
# (tests/gpu/bench-incremental.sh).
#
#   python3 static_work.py GB LOG CMD
import os
import sys
import time

import torch

gb, log, cmd = float(sys.argv[1]), open(sys.argv[2], "a", buffering=1), sys.argv[3]
CHUNK, TENSOR = 4 << 20, 256 << 20
n = max(1, int(gb * (1 << 30) // TENSOR))
g = torch.Generator(device="cuda")
g.manual_seed(1)
bufs = [torch.randint(0, 256, (TENSOR,), dtype=torch.uint8, device="cuda", generator=g) for _ in range(n)]
torch.cuda.synchronize()
log.write(f"ready pid={os.getpid()} tensors={n}\n")
per = TENSOR // CHUNK
done = 0
while True:
    time.sleep(0.05)
    try:
        with open(cmd) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        continue
    for line in lines[done:]:
        _, pct, seed = line.split()
        total = n * per
        k = int(total * float(pct) / 100)
        pick = torch.randperm(total, generator=torch.Generator().manual_seed(int(seed)))[:k].tolist()
        for c in pick:
            b, o = divmod(c, per)
            bufs[b][o * CHUNK].add_(1)
        torch.cuda.synchronize()
        s = sum(int(x[:4096].sum()) for x in bufs)
        log.write(f"changed {k} {s}\n")
    done = len(lines)
