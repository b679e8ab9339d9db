"""PNG plots of a load run (matplotlib, headless): requests per second by outcome, TTFT of admitted
requests, and the active degradation steps, with the phase boundaries marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_run"]


def plot_run(path: Path, title: str, series: Sequence[dict[str, Any]], phases: Sequence[tuple[str, float, float]],
             ladder: Sequence[tuple[float, list[str]]]) -> Path:
    """Write the figure to `path`. `phases`: (name, start s, end s); `ladder`: (t s, active step names)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rate, ax_ttft, ax_ladder) = plt.subplots(3, 1, figsize=(10, 8), sharex=True,
                                                      gridspec_kw={"height_ratios": [3, 3, 1]})
    t = [row["t"] for row in series]
    for key, colour in (("sent", "grey"), ("ok", "tab:green"), ("429", "tab:orange"), ("5xx", "tab:red"),
                        ("other", "tab:purple")):
        values = [row[key] for row in series]
        if any(values) or key in ("sent", "ok"):
            ax_rate.plot(t, values, label=key, color=colour, drawstyle="steps-post")
    ax_rate.set_ylabel("requests / s (by send time)")
    ax_rate.legend(loc="upper left", fontsize=8)
    for key, style in (("ttft_p50_ms", "-"), ("ttft_p99_ms", "--")):
        ax_ttft.plot(t, [row[key] for row in series], style, label=key.replace("_ms", ""), color="tab:blue")
    ax_ttft.set_ylabel("TTFT of admitted, ms")
    ax_ttft.legend(loc="upper left", fontsize=8)
    steps = sorted({s for _, names in ladder for s in names})
    for i, step in enumerate(steps):
        ax_ladder.plot([p[0] for p in ladder], [i + 0.8 * (step in names) for _, names in ladder],
                       drawstyle="steps-post", label=step)
    ax_ladder.set_yticks(range(len(steps)), steps, fontsize=7) if steps else ax_ladder.set_yticks([])
    ax_ladder.set_ylabel("ladder")
    ax_ladder.set_xlabel("seconds since start")
    for axis in (ax_rate, ax_ttft, ax_ladder):
        for name, start, _end in phases:
            axis.axvline(start, color="black", linewidth=0.5, alpha=0.4)
            if axis is ax_rate:
                axis.annotate(name, (start, 1), xycoords=("data", "axes fraction"), fontsize=8,
                              va="top", ha="left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
