#!/usr/bin/env bash
# Where the driver puts a process's checkpointed state, on the GPU machine:
#
#   bash tests/gpu/residual-maps.sh
#
# A PyTorch process holding a 1 GiB tensor (no gpucr) is locked and
# checkpointed with cudackpt; the mappings with at least 1 MiB resident that
# the checkpoint made or changed, and those it removed, are listed from
# /proc/PID/smaps (with their VmFlags), then the process is restored.
# H200, driver 580.159.04, 2026-11-27: the checkpoint removed the driver's
# /dev/nvidiactl and /dev/nvidia-uvm mappings and made one anonymous private
# mapping of 2668 MiB holding the device state (not locked: CRIU's
# lazy-pages would serve it lazily, and the driver's restore then waits for
# it page by page; see tests/gpu/README.md, cold start).
set -u
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh # NVLink multicast off
mkdir -p /tmp/probe
make -k gpu-apps >/dev/null 2>&1
python3 -c '
import torch, time, os
x = torch.randn(256 << 20, device="cuda")  # 1 GiB
y = x @ torch.randn(4096, 4096, device="cuda")[:1, :1].expand(1, 1) if False else x * 2
torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
while True: time.sleep(0.2)
' > /tmp/probe/app.out 2>&1 &
for i in $(seq 200); do grep -q ready /tmp/probe/app.out && break; sleep 0.1; done
P=$(awk '/ready/{print $2}' /tmp/probe/app.out)
echo pid $P
anon() { python3 - "$1" <<'PY'
import sys
pid=sys.argv[1]
tot=0; out=[]
cur=None
for l in open(f"/proc/{pid}/smaps"):
    f=l.split()
    if '-' in f[0] and len(f)>=5 and ':' not in f[0]:
        a,b=f[0].split('-'); cur=[int(a,16),int(b,16),f[1],f[5] if len(f)>5 else '', 0, '']
        out.append(cur)
    elif f[0]=='Rss:': cur[4]=int(f[1])*1024
    elif f[0]=='VmFlags:': cur[5]=' '.join(f[1:])
for a,b,perm,name,rss,fl in out:
    print(f"{a:x}-{b:x} {perm} {name or '[anon]'} size={(b-a)>>20}M rss={rss>>20}M flags={fl}")
PY
}
anon $P > /tmp/probe/before.txt
S=$(python3 -c "import sys; print(sum(int(l.split('rss=')[1].split('M')[0]) for l in open('/tmp/probe/before.txt')))")
echo "rss before: ${S}M"
build/gpu/bin/cudackpt lock checkpoint $P
anon $P > /tmp/probe/after.txt
S=$(python3 -c "import sys; print(sum(int(l.split('rss=')[1].split('M')[0]) for l in open('/tmp/probe/after.txt')))")
echo "rss after: ${S}M"
echo "== mappings new or changed by the checkpoint (rss >= 1M):"
diff <(sort /tmp/probe/before.txt) <(sort /tmp/probe/after.txt) | grep '^>' | awk '{ if ($0 ~ /rss=[1-9][0-9]*M/) print }' | head -30
echo "== gone:"
diff <(sort /tmp/probe/before.txt) <(sort /tmp/probe/after.txt) | grep '^<' | awk '{ if ($0 ~ /rss=[1-9][0-9]*M/) print }' | head -10
build/gpu/bin/cudackpt restore unlock $P
kill $P
