"""Commands the command line prints for the user to run next (paging, the demo's
"look around"), written so that they run as printed.

A printed command has to name the program the way the user's shell can reach it.
After ``uv run ... statekeeper demo`` the console script lives in the project's
``.venv``, which is not on the shell's ``PATH``, so a bare ``statekeeper`` would
say "command not found". :func:`program` picks, in order:

1. under ``uv run`` (``$UV``/``$UV_RUN_RECURSION_DEPTH`` set) in a uv project:
   ``uv run --frozen --no-dev --extra cli statekeeper`` (with ``--project DIR``
   when the working directory is outside the project). The project is the one
   whose ``.venv`` is running, or, when ``$UV_PROJECT_ENVIRONMENT`` points uv at
   another environment (nox does), the uv project around the working directory;
2. ``statekeeper``, when that name on ``PATH`` is the script that is running;
3. the ``uv run`` form again when this interpreter is the ``.venv`` of a uv
   project (``uv.lock`` next to it), which is where ``uv sync`` puts it;
4. the console script's absolute path;
5. ``python -m statekeeper.cli`` with this interpreter's absolute path.

Arguments are quoted for a POSIX shell (:func:`shlex.join`).

:func:`found_instead` says what is at a URL that holds no statekeeper store (a
LangGraph ``SqliteSaver`` database, another program's SQLite database, a plain
file where a directory is named, an Agent Framework checkpoint directory,
``memory://``) and, for the
frameworks' stores, the ``statekeeper import`` command that brings them in.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["UV_RUN", "command", "found_instead", "program"]

#: How README command 1 runs the command line from a checkout.
UV_RUN = ("uv", "run", "--frozen", "--no-dev", "--extra", "cli", "statekeeper")
SCRIPT = "statekeeper"


def _is_uv_project(directory: Path) -> bool:
    return (directory / "pyproject.toml").is_file() and (directory / "uv.lock").is_file()


def _uv_project(venv: Path) -> Path | None:
    """The uv project whose ``.venv`` is ``venv``, if it is one."""
    if venv.name == ".venv" and _is_uv_project(venv.parent):
        return venv.parent
    return None


def _project_around(cwd: Path) -> Path | None:
    """The nearest directory at or above ``cwd`` that is a uv project."""
    here = cwd.resolve()
    return next((d for d in (here, *here.parents) if _is_uv_project(d)), None)


def _uv_run(project: Path, cwd: Path) -> list[str]:
    try:
        cwd.resolve().relative_to(project.resolve())
    except ValueError:
        # uv finds the project from the working directory; from elsewhere, name it.
        return [*UV_RUN[:2], "--project", str(project), *UV_RUN[2:]]
    return list(UV_RUN)


def program(
    env: Mapping[str, str] | None = None,
    prefix: str | None = None,
    executable: str | None = None,
    cwd: Path | None = None,
) -> list[str]:
    """The words that run this command line again from the user's shell.

    The parameters default to this process's environment, ``sys.prefix``,
    ``sys.executable`` and working directory; tests pass their own.
    """
    env = os.environ if env is None else env
    venv = Path(prefix if prefix is not None else sys.prefix)
    exe = Path(executable if executable is not None else sys.executable)
    here = cwd if cwd is not None else Path.cwd()
    script = exe.parent / SCRIPT
    project = _uv_project(Path(env["VIRTUAL_ENV"]) if env.get("VIRTUAL_ENV") else venv)
    under_uv = bool(env.get("UV") or env.get("UV_RUN_RECURSION_DEPTH"))
    if under_uv and project is None and env.get("UV_PROJECT_ENVIRONMENT"):
        project = _project_around(here)
    if under_uv and project is not None:
        return _uv_run(project, here)
    found = shutil.which(SCRIPT, path=env.get("PATH", ""))
    if found is not None and script.exists() and Path(found).resolve() == script.resolve():
        return [SCRIPT]
    project = _uv_project(venv)
    if project is not None:
        return _uv_run(project, here)
    if script.exists():
        return [str(script.absolute())]
    return [str(exe.absolute()), "-m", "statekeeper.cli"]


def command(*args: str, prog: list[str] | None = None) -> str:
    """A command line for a POSIX shell: the program (:func:`program`), then ``args``."""
    return shlex.join([*(prog if prog is not None else program()), *args])


# -- what is at a URL that holds no store ---------------------------------------------

_SQLITE_MAGIC = b"SQLite format 3\x00"


def _sqlite_tables(path: Path) -> list[str] | None:
    """The tables of the SQLite database at ``path``, read-only; None if it is not one."""
    import sqlite3  # here: only a command that found no store needs it

    try:
        with path.open("rb") as f:
            if f.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                return None
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            db.close()
    except (OSError, sqlite3.Error):
        return None
    return sorted(str(name) for (name,) in rows)


def _agent_framework_files(path: Path) -> int:
    """How many ``<checkpoint id>.json`` files of Agent Framework's
    ``FileCheckpointStorage`` the directory holds (0 if it does not look like one)."""
    import json

    files = sorted(p for p in path.glob("*.json") if p.is_file())
    try:
        first = json.loads(files[0].read_text(encoding="utf-8")) if files else None
    except (OSError, ValueError):
        return 0
    return len(files) if isinstance(first, dict) and "checkpoint_id" in first else 0


def _import(source: Path, kind: str) -> tuple[str, ...]:
    target = source.with_name(f"{source.stem}-statekeeper.db")
    return ("import", str(source), "--from", kind, "--url", f"sqlite:///{target}")


def found_instead(backend: str, path: str | None) -> tuple[str, tuple[str, ...] | None] | None:
    """What is at a store location that holds no statekeeper store: ``(a sentence
    saying what it is, the arguments of the statekeeper command that brings it in
    or None)``; None when there is nothing there to describe (a new store may be
    made there)."""
    if backend == "memory":
        return (
            "memory:// lives only in the process that opens it, and every statekeeper "
            "command is a process of its own, so it never finds one; name a file:// or "
            "sqlite:// store",
            None,
        )
    if path is None:
        return None
    where = Path(path)
    if backend == "sqlite" and where.is_file():
        # (a file that is not SQLite at all never gets here: opening it says so)
        tables = _sqlite_tables(where) or []
        if {"checkpoints", "writes"} <= set(tables):
            return (
                f"{where} is a LangGraph SqliteSaver database (tables: {', '.join(tables)}), "
                "not a statekeeper store",
                _import(where, "langgraph-sqlite"),
            )
        if tables:
            return (
                f"{where} is a SQLite database of another program (tables: "
                f"{', '.join(tables)}); statekeeper keeps its store in a database of its own",
                None,
            )
    if backend == "file" and where.is_file():
        return f"{where} is a file, not a directory: a file:// URL names a directory", None
    if backend == "file" and where.is_dir():
        n = _agent_framework_files(where)
        if n:
            files = f"{n} checkpoint file" + ("" if n == 1 else "s")
            return (
                f"{where} is an Agent Framework FileCheckpointStorage directory ({files}), "
                "not a statekeeper store",
                _import(where, "agent-framework"),
            )
    return None
