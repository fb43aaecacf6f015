"""The table and the picture of tests/gpu/bench-concurrent.sh.

    python3 stall_table.py EVENTS PNG

EVENTS has one line per checkpoint: "SIZE LINE START END REPORT STEPLOG [failed]"
(LINE: anchor, base, stop-copy, concurrent or cow; START and END: time.time()
around the checkpoint command; REPORT: its --json output, "-" for the
anchor's; STEPLOG: the job's log, "st I T" per step). For each checkpoint
the application's stall is its longest gap between two steps from START to
END plus a second; the normal step is the median gap over the 3 s before
START; for a concurrent one, the step while its image is written is the
median gap over the background copy (its report's gpu-background step, at
the end of the command). The picture draws, for each size, the anchor, the
build before and the concurrent checkpoint side by side: the job's step
gaps over time around that line's first checkpoint.
"""
import json
import statistics
import sys


def steps(path):
    out = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[0] == "st":
                out.append((int(p[1]), float(p[2])))
    return out


def gaps(st, lo, hi):
    """(time, gap) of each step ending in [lo, hi], after a step of the same run."""
    res = []
    for (i0, t0), (i1, t1) in zip(st, st[1:]):
        if i1 == i0 + 1 and lo <= t1 <= hi:
            res.append((t1, t1 - t0))
    return res


def phases(report):
    if report == "-":
        return {}, {}
    try:
        r = json.loads(open(report).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}, {}
    top = {p["name"]: p["seconds"] for p in r.get("phases") or []}
    g = (r.get("gpu_processes") or [{}])[0].get("phases") or []
    return top, {p["name"]: p["seconds"] for p in g}


def main():
    events = [line.split() for line in open(sys.argv[1]) if line.strip()]
    rows = []
    first = {}
    cache = {}
    for size, line, start, end, report, steplog, *rest in events:
        start, end = float(start), float(end)
        if rest and rest[0] == "failed":
            rows.append({"size": size, "line": line, "failed": True})
            first.setdefault((size, line), None)
            continue
        st = cache.get(steplog) or steps(steplog)
        cache[steplog] = st
        normal = [g for _, g in gaps(st, start - 3, start)]
        window = gaps(st, start, end + 1)
        stall = max((g for _, g in window), default=float("nan"))
        top, helper = phases(report)
        bg = top.get("gpu-background", 0.0)
        during = [g for t, g in gaps(st, end - bg, end)] if bg > 0.2 else []
        med = statistics.median(normal) if normal else float("nan")
        rows.append({
            "size": size, "line": line, "stall": stall, "command": end - start, "normal_ms": med * 1e3,
            "background": bg, "window_ratio": (statistics.median(during) / med) if during and normal else None,
            "helper": helper,
        })
        first.setdefault((size, line), (start, st))
    print("| size | line | stall (app's longest step gap) | checkpoint command | image written after the stall | step while written / normal step | helper steps in the stall |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("failed"):
            print(f"| {r['size']} | {r['line']} | failed | | | | |")
            continue
        h = r["helper"]
        shown = ", ".join(f"{k} {v:.3f}" for k, v in h.items() if v >= 0.005 and k != "background-copy")
        ratio = f"{r['window_ratio']:.2f}x (normal {r['normal_ms']:.1f} ms)" if r["window_ratio"] else f"- (normal {r['normal_ms']:.1f} ms)"
        bg = f"{r['background']:.2f} s" if r["background"] else "-"
        print(f"| {r['size']} | {r['line']} | {r['stall']:.3f} s | {r['command']:.2f} s | {bg} | {ratio} | {shown or '-'} |")
    if len(sys.argv) > 2:
        draw(first, sys.argv[2])


def draw(first, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no picture)")
        return
    sizes = sorted({s for s, _ in first}, key=lambda s: (not s[0].isdigit(), float(s.split(":")[0]) if s[0].isdigit() else 0, s))
    order = [l for l in ("anchor", "base", "concurrent", "cow") if any((s, l) in first for s in sizes)]
    names = {"anchor": "anchor: driver checkpoint API + CRIU", "base": "gpucr before (copy while stopped)",
             "concurrent": "gpucr concurrent", "cow": "gpucr copy-on-write"}
    colors = {"anchor": "tab:red", "base": "tab:orange", "concurrent": "tab:green", "cow": "tab:blue"}
    fig, axes = plt.subplots(len(sizes), len(order), figsize=(5.2 * len(order), 3.3 * len(sizes)), squeeze=False, sharey=True)
    for row, size in enumerate(sizes):
        for col, line in enumerate(order):
            ax = axes[row][col]
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            if (size, line) not in first:
                ax.set_visible(False)
                continue
            if first[(size, line)] is None:
                ax.set_title(f"{names[line]}, {size}", fontsize=9)
                ax.annotate("the checkpoint failed in this run", xy=(0.5, 0.5), xycoords="axes fraction", ha="center")
                continue
            start, st = first[(size, line)]
            g = gaps(st, start - 2, start + 120)
            stall = max((x for t, x in g if t < start + 100), default=0)
            g = [(t, x) for t, x in g if t - start <= stall + 3]
            ts = [t - start for t, _ in g]
            ax.plot(ts, [x * 1e3 for _, x in g], ".", ms=2, color=colors[line])
            for t, x in g:  # a long gap as the span it lasted
                if x > 0.05:
                    ax.hlines(x * 1e3, t - start - x, t - start, color=colors[line], lw=2)
            ax.annotate(f"stall {stall:.2f} s", xy=(0.97, 0.55), xycoords="axes fraction", ha="right", fontsize=10,
                        color=colors[line], weight="bold")
            ax.set_xlim(-2, stall + 3)
            ax.set_title(f"{names[line]}, {size} GB" if size[0].isdigit() else f"{names[line]}, {size}", fontsize=9)
            if row == len(sizes) - 1:
                ax.set_xlabel("seconds from the checkpoint command")
            if col == 0:
                ax.set_ylabel("ms between two steps")
    fig.suptitle("A leave-running checkpoint as the application sees it (each dot: one step of the job)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"picture: {png}")


if __name__ == "__main__":
    main()
