"""The ``statekeeper`` command line. ``docs/cli.md`` documents every command.

Importing this package imports nothing beyond the standard library; only
:mod:`.commands` imports typer and rich, so ``import statekeeper`` never does.

- :mod:`.entry`: the console script; explains a missing ``cli`` extra.
- :mod:`.commands`: the typer app, one function per command.
- :mod:`.output`: the store URL, rich or ``--json`` output, errors and exit codes.
- :mod:`.ops`: the long-running work (``streams``, ``verify``, ``repair``, ``copy``).
- :mod:`.demo` and :mod:`.demo_render`: ``statekeeper demo`` and how it tells its story.
"""
