"""The ``statekeeper`` command line. ``docs/cli.md`` documents every command.

Importing this package imports nothing beyond the standard library; only
:mod:`.base` and the command modules import typer, so ``import statekeeper`` never
does. Start-up is kept to what the command needs: ``--help`` imports typer and
these modules only; rich, pydantic, asyncio and the store machinery come when a
command runs, and only the backend of the URL's scheme is imported
(``tests/cli/test_cli_startup.py`` checks which modules; the benchmarks'
``startup/*`` workloads measure the time).

- :mod:`.entry`: the console script; explains a missing ``cli`` extra.
- :mod:`.base`: the typer app, the common options, how a command opens its store
  (read-only, writable, or allowed to create it), ``--json`` usage errors.
- :mod:`.commands`: ``demo``, ``info``, ``streams``, ``ls``, ``show``, ``latest``;
  registers every command in ``--help`` order.
- :mod:`.maintenance`: ``verify``, ``repair``, ``copy``, ``prune``, ``purge``.
- :mod:`.retention`: ``sweep`` (a retention policy, once) and ``compact``.
- :mod:`.frameworks`: what ``verify`` and ``repair`` check beyond the store's own
  records (LangGraph pending writes whose checkpoint is gone).
- :mod:`.importing`: ``statekeeper import`` of a framework's own store (an Agent
  Framework ``FileCheckpointStorage`` directory, a LangGraph SQLite or PostgreSQL
  database).
- :mod:`.rekeying`: ``rekey``, every record under the active key of ``$STATEKEEPER_KEYS``.
- :mod:`.output`: the store URL, opening a store (with ``encryption="env"`` when
  ``$STATEKEEPER_KEYS`` is set), rich or ``--json`` output, errors and exit codes.
- :mod:`.hints`: commands printed for the user to run next, so that they run as printed.
- :mod:`.ops`: the long-running work of ``streams`` and ``copy``.
- :mod:`.demo` and :mod:`.demo_render`: ``statekeeper demo`` and how it tells its story.
- ``__main__``: ``python -m statekeeper.cli``, the same as the console script.
"""
