"""PNG plots: cost against N, one line per store, log-log (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from .runner import Results

PLOTTED = {
    "get_latest": "get_latest (or equivalent): median per call",
    "middle_page": "page of 20 from the middle of the history: median per call",
    "list_all": "list the whole stream: median per call",
}


def make_plots(results: Results, sizes: list[int], directory: Path) -> dict[str, Path]:
    """Write one PNG per plotted workload; return {title: path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for op, title in PLOTTED.items():
        rows = results.ops.get(op, {})
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(8.5, 5.5), dpi=110)
        palette = plt.get_cmap("tab20")
        for index, row in enumerate(rows):
            points = [(n, cell["stat"]) for n in sizes if "stat" in (cell := rows[row].get(n, {}))]
            if not points:
                continue
            xs = [n for n, _ in points]
            ys = [s["median"] for _, s in points]
            low = [max(s["median"] - s["p10"], 0.0) for _, s in points]
            high = [max(s["p90"] - s["median"], 0.0) for _, s in points]
            ours = row.startswith("statekeeper")
            ax.errorbar(
                xs,
                ys,
                yerr=[low, high],
                label=row,
                marker="o" if ours else "s",
                linestyle="-" if ours else "--",
                linewidth=2.0 if ours else 1.2,
                capsize=3,
                # dark shades first, then their light twins: 20 distinct colours
                color=palette((2 * index) % 20 + (2 * index) // 20),
                elinewidth=0.8,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N: checkpoints in the stream (plus as many in other streams)")
        ax.set_ylabel("seconds per call (median, bars p10-p90)")
        ax.set_title(title)
        ax.set_xticks(sizes, [f"{n // 1000}k" if n >= 1000 else str(n) for n in sizes])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = directory / f"{op}.png"
        fig.savefig(path)
        plt.close(fig)
        written[title] = path
    return written


def plot_rates(
    series: dict[str, list[tuple[int, float, float, float]]],
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str = "saves per second (median of rounds, bars min-max)",
) -> Path:
    """One line per store of (x, median, low, high), log x: a rate against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8.5, 5.5), dpi=110)
    ticks: set[int] = set()
    for name, points in series.items():
        if not points:
            continue
        xs = [p[0] for p in points]
        ticks.update(xs)
        ys = [p[1] for p in points]
        ours = name.startswith("statekeeper")
        ax.errorbar(
            xs,
            ys,
            yerr=[
                [max(y - p[2], 0.0) for y, p in zip(ys, points, strict=True)],
                [max(p[3] - y, 0.0) for y, p in zip(ys, points, strict=True)],
            ],
            label=name,
            marker="o" if ours else "s",
            linestyle="-" if ours else "--",
            linewidth=2.0 if ours else 1.2,
            capsize=3,
        )
    ax.set_xscale("log")
    ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
