"""The page's plots: one horizontal bar per store of a read's median, log scale
(matplotlib, Agg backend; without matplotlib the page has no plots)."""

from __future__ import annotations

from pathlib import Path

from .render import Results

PLOTTED = {
    "get_latest": "get_latest (or the peer's equivalent): median per call",
    "middle_page": "a page of 20 from the middle of the history: median per call",
    "list_all": "list the whole stream: median per call",
}


def make_plots(results: Results, titles: dict[str, str], directory: Path) -> dict[str, str]:
    """One PNG per read of :data:`PLOTTED` in ``directory``; {file name: its title}.
    ``titles`` names the subjects (the last part of a benchmark's name)."""
    try:
        import matplotlib
    except ImportError:
        return {}
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for read, title in PLOTTED.items():
        bars = sorted(
            (float(bench.median()), f"{titles.get(name.rsplit('/', 1)[1], name)} ({size})")
            for name, bench in results.items()
            if name.startswith(f"{read}@") and (size := name.split("@")[1].split("/")[0])
        )
        if not bars:
            continue
        fig, ax = plt.subplots(figsize=(8.5, 0.4 * len(bars) + 1.5), dpi=110)
        ours = ["statekeeper" in label for _, label in bars]
        ax.barh(
            [label for _, label in bars],
            [median for median, _ in bars],
            color=["tab:blue" if o else "tab:gray" for o in ours],
        )
        ax.set_xscale("log")
        ax.set_xlabel("seconds per call (median; the size is the stream's checkpoints)")
        ax.set_title(title)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(directory / f"{read}.png")
        plt.close(fig)
        written[f"{read}.png"] = title
    return written
