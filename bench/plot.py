"""PNG figures of the benchmark JSON (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use("Agg"): the backend is fixed at import


def plot_kv(rows: list[dict[str, Any]], out: Path) -> None:
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for col, w in enumerate(workloads):
        mine = [r for r in rows if r["workload"] == w]
        for policy in dict.fromkeys(r["policy"] for r in mine):
            pts = sorted((r["concurrency"], r) for r in mine if r["policy"] == policy)
            xs = [c for c, _ in pts]
            axes[0][col].plot(xs, [r["throughput_steps_per_min"] for _, r in pts], "o-",
                              label=policy)
            axes[1][col].plot(xs, [r["prefix_hit_rate"] for _, r in pts], "o-", label=policy)
        for row, label in ((0, "steps / min"), (1, "prefix hit rate")):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xlabel("live programs")
            axes[row][col].set_ylabel(label)
            axes[row][col].set_title(f"{w} (simulated)")
        axes[0][col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_slo(rows: list[dict[str, Any]], out: Path) -> None:
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(scenarios) * 1.2), 8))
    orderings = list(dict.fromkeys(r["ordering"] for r in rows))
    width = 0.8 / max(1, len(orderings))
    for i, ordering in enumerate(orderings):
        vals = {r["scenario"]: r for r in rows if r["ordering"] == ordering}
        xs = [k + i * width for k in range(len(scenarios))]
        axes[0].bar(xs, [vals[s]["esg"] if s in vals else 0 for s in scenarios], width,
                    label=ordering)
        axes[1].bar(xs, [vals[s]["goodput_rps"] if s in vals else 0 for s in scenarios], width)
    for ax, label in ((axes[0], "ESG"), (axes[1], "goodput (req/s)")):
        ax.set_xticks([k + 0.4 for k in range(len(scenarios))], scenarios, rotation=30,
                      fontsize=7)
        ax.set_ylabel(label)
    axes[0].set_title("SLO stack (simulated)")
    axes[0].legend(fontsize=6, ncol=4)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
