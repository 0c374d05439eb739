"""The ``statekeeper`` console script.

This module imports nothing beyond the standard library at import time, so the
console script can explain itself when the ``cli`` extra (typer and rich) is not
installed instead of dying with an ImportError. ``import statekeeper`` never
imports typer or rich: only this entry point does, and only when it runs.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["MISSING_EXTRA_MESSAGE", "main"]

MISSING_EXTRA_MESSAGE = (
    "statekeeper's command line needs the cli extra: pip install 'statekeeper[cli]'"
)

#: Exit status for a usage problem, the same one click uses for bad arguments.
_USAGE = 2


def main() -> None:
    """Run the command line (exit 0 ok, 1 data problem found, 2 usage error)."""
    # rich is only looked for: a command imports it when it prints, --help never does.
    try:
        import typer  # noqa: F401

        missing = importlib.util.find_spec("rich") is None
    except (ImportError, ValueError):
        missing = True
    if missing:
        print(MISSING_EXTRA_MESSAGE, file=sys.stderr)
        raise SystemExit(_USAGE) from None
    from .commands import run

    run()


if __name__ == "__main__":
    main()
