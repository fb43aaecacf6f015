"""The table and the plot of tests/gpu/bench-steps.sh, from its logs:

    python3 steps_table.py LOGS PAIRS "WORKLOAD..."

For each workload, over the pairs where both runs finished: the median of
the runs' median steps (min-max), gpucr / plain, and the median of the
pairs' ratios (min-max); then the same for each run's fastest-decile step
(its 10th percentile), which the machine's noise (other processes, clocks)
moves less than the median. step-times.png in LOGS: every step of every run.
"""
import json
import statistics
import sys


def one(logs, w, m, p):
    try:
        for line in open(f"{logs}/run.{m}.{p}"):
            if line.startswith("{"):
                r = json.loads(line)
                if r["workload"] == w:
                    return r
    except (OSError, ValueError, KeyError):
        pass
    return None


def p10(r):
    t = sorted(r["times_ms"])
    return t[len(t) // 10]


def row(label, am, gm):
    ratios = [y / x for x, y in zip(am, gm)]
    return (f"| {label} | {statistics.median(am):.3f} ({min(am):.3f}-{max(am):.3f}) | {statistics.median(gm):.3f} "
            f"({min(gm):.3f}-{max(gm):.3f}) | {statistics.median(gm) / statistics.median(am):.3f}x | "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")


def main():
    logs, pairs, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
    print()
    print("| workload, statistic of each run | plain, ms (min-max over runs) | gpucr run | gpucr / plain "
          "| median of pair ratios (min-max) |")
    print("|---|---|---|---|---|")
    plot, notes = [], []
    for w in workloads:
        # complete pairs only: a pair cut by the deadline would bias the medians
        both = [(one(logs, w, "plain", p), one(logs, w, "gpucr", p)) for p in range(1, pairs + 1)]
        both = [(a, g) for a, g in both if a and g]
        if not both:
            print(f"| {w} | no complete pair | - | - | - |")
            continue
        a, g = [x for x, _ in both], [y for _, y in both]
        print(row(f"{w}, median step", [r["median_ms"] for r in a], [r["median_ms"] for r in g]))
        print(row(f"{w}, 10th percentile step", [p10(r) for r in a], [p10(r) for r in g]))
        same = len({r["last"] for r in a + g}) == 1
        notes.append(f"{w}: {len(both)} pairs, {a[0]['steps']} steps a run; last value the same in every run: "
                     f"{'yes' if same else 'no'}")
        plot.append((w, [t for r in a for t in r["times_ms"]], [t for r in g for t in r["times_ms"]]))
    print()
    for n in notes:
        print(n)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(plot), figsize=(4 * len(plot), 4), squeeze=False)
        for ax, (w, a, g) in zip(axes[0], plot):
            ax.violinplot([a, g], showmedians=True)
            ax.set_xticks([1, 2], ["plain", "gpucr run"])
            ax.set_title(w)
            ax.set_ylabel("step time, ms")
        fig.tight_layout()
        fig.savefig(f"{logs}/step-times.png", dpi=100)
        print("\nplot: step-times.png")
    except Exception as e:  # a machine without matplotlib still gets the table
        print(f"\nno plot: {e}")


if __name__ == "__main__":
    main()
