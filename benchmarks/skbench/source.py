"""What the focused benchmarks (``api.py``, ``integrations.py``, ``hot.py``,
``pg.py``) measure, and how a section is spliced into ``docs/benchmarks.md`` (the
rest of what they share is :mod:`skbench.script`).

By default a run measures the committed ``src/`` of a revision, exported with
``git archive`` and imported ahead of the checkout, so colleagues' uncommitted
edits in a shared checkout cannot leak into the figures; ``--working-tree``
measures the checkout as it is and says which files were dirty.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["command", "git", "import_source", "splice"]

ROOT = Path(__file__).resolve().parents[2]


def git(*args: str) -> str:
    """The output of ``git ARGS`` in the checkout, stripped ('' when it fails)."""
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.rstrip()


def import_source(args: argparse.Namespace, workdir: Path) -> tuple[str | None, dict[str, str]]:
    """Import the statekeeper to measure; return the commit (``None`` for the
    working tree) and the ``commit``/``tree_note`` facts the report prints."""
    if args.working_tree:
        dirty = git("status", "--porcelain", "--", "src")
        changed = ", ".join(line[3:] for line in dirty.splitlines())
        note = f", with uncommitted changes in: {changed}" if dirty else " (src/ as committed)"
        return None, {"commit": git("log", "-1", "--format=%h %s"), "tree_note": note}
    commit = git("rev-parse", "--verify", f"{args.rev}^{{commit}}")
    if not commit:
        raise SystemExit(f"--rev {args.rev!r} is not a commit")
    snapshot = workdir / "src-snapshot"
    snapshot.mkdir()
    archive = subprocess.run(
        ["git", "archive", commit, "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(snapshot)], input=archive, check=True)
    sys.path.insert(0, str(snapshot / "src"))
    import statekeeper

    where = Path(statekeeper.__file__).resolve()
    if snapshot.resolve() not in where.parents:
        raise SystemExit(f"statekeeper was imported from {where}, not from the snapshot")
    return commit, {
        "commit": git("log", "-1", "--format=%h, committed %ci", commit),
        "tree_note": " (its committed src/, exported with git archive; the checkout's "
        "uncommitted edits are not measured)",
    }


def splice(document: str, heading: str, section: str) -> str:
    """Replace the section under ``heading`` in ``document`` (up to the next ``## ``
    heading), or append it."""
    lines = document.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip() == heading)
    except StopIteration:
        return document.rstrip("\n") + "\n\n" + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def command(session: str, script: str) -> str:
    """How this run was started, as a command to print: the nox session when run
    by it, else the script, with this run's arguments."""
    extra = " ".join(shlex.quote(a) for a in sys.argv[1:])
    if os.environ.get("NOX_CURRENT_SESSION") == session:
        return f"uv run nox -s {session}" + (f" -- {extra}" if extra else "")
    return f"uv run python {script}" + (f" {extra}" if extra else "")
