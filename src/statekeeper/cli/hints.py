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
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["UV_RUN", "command", "program"]

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
