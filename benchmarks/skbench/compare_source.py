"""The two statekeepers that ``compare.py`` measures: each revision's committed
``src/`` (and the Redis plugin's ``backends/statekeeper-redis/src``), exported with
``git archive`` into a directory of its own, as :func:`skbench.source.import_source`
does for one revision; or, for ``--after-working-tree``, the checkout as it is.

Nothing here imports statekeeper. Each side is measured in child processes whose
``PYTHONPATH`` puts that side's tree ahead of the installed package
(:meth:`Side.env`), and every child checks where it imported statekeeper from.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .source import ROOT, git

__all__ = ["BENCHMARKS", "TREES", "Side", "export", "working_tree"]

#: The trees a side needs: the core and the plugin shipped beside it.
TREES = ("src", "backends/statekeeper-redis/src")
#: Where ``skbench`` lives, for the children's own imports.
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Side:
    """One end of the comparison: its label, what it is, and the trees it imports."""

    label: str  # "before" or "after"
    rev: str  # as given on the command line
    commit: str | None  # full hash; None for the working tree
    describe: str  # "dc54e45 subject, committed ...", for the report
    paths: tuple[Path, ...]  # PYTHONPATH entries, the core's src first
    note: str = ""

    @property
    def src(self) -> Path:
        """The directory the ``statekeeper`` package must be imported from."""
        return self.paths[0] / "statekeeper"

    def env(self) -> dict[str, str]:
        """The environment of this side's children: its trees, then ``skbench``,
        ahead of the installed statekeeper; bytecode written and reused as in a
        normal installation; no ``STATEKEEPER_URL`` to leak into a command; one hash
        seed."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("STATEKEEPER_URL", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH")
        }
        env["PYTHONPATH"] = os.pathsep.join([*map(str, self.paths), str(BENCHMARKS)])
        env["COLUMNS"] = "80"
        # one hash seed for every child of both sides: identical code then lays out
        # its dicts and sets alike (a random seed per process moved one identical
        # op by 4% between the two sides)
        env["PYTHONHASHSEED"] = "0"
        return env


def _resolve(rev: str) -> str:
    commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if not commit:
        raise SystemExit(f"{rev!r} is not a commit in {ROOT}")
    return commit


def export(label: str, rev: str, into: Path) -> Side:
    """``git archive`` the :data:`TREES` of ``rev`` into ``into/label``."""
    commit = _resolve(rev)
    dest = into / label
    dest.mkdir(parents=True)
    present = [t for t in TREES if git("ls-tree", "-d", "--name-only", commit, t)]
    if "src" not in present:
        raise SystemExit(f"{rev} ({commit[:9]}) has no src/")
    archive = subprocess.run(
        ["git", "archive", commit, *present], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return Side(
        label=label,
        rev=rev,
        commit=commit,
        describe=git("log", "-1", "--format=%h %s, committed %ci", commit),
        paths=tuple(dest / t for t in present),
        note="its committed trees, exported with git archive",
    )


def working_tree(label: str) -> Side:
    """The checkout's trees as they are, naming the files that differ from HEAD."""
    dirty = git("status", "--porcelain", "--", *TREES)
    changed = ", ".join(line[3:] for line in dirty.splitlines())
    return Side(
        label=label,
        rev="working tree",
        commit=None,
        describe=git("log", "-1", "--format=%h %s, committed %ci"),
        paths=tuple(ROOT / t for t in TREES if (ROOT / t).is_dir()),
        note=(
            f"the working tree, with uncommitted changes in: {changed}"
            if dirty
            else "the working tree (as committed)"
        ),
    )
