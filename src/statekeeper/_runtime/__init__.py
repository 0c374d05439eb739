"""The concurrency machinery every backend with threads of its own shares: one thread
worker, one group commit, the inline budget, and one finalizer.

The modules:

- :mod:`.worker`: :class:`~.worker.Worker`, one daemon thread that runs submitted
  calls in order and hands each outcome back with one ``call_soon_threadsafe``;
  cancellation before the start skips a call; ``stop``/``run_last`` end the thread.
  Every store thread is one (the file store's pool, each SQLite connection's).
- :mod:`.threads`: :class:`~.threads.ThreadDoor`, a pool of up to ``size`` workers
  started on demand, fork-aware (the file store's worker hop).
- :mod:`.group`: :class:`~.group.GroupCommit` (SPEC S15), on a worker: the writes
  queued together run as one group with one commit, through a
  :class:`~.group.GroupRunner` that says how a group is run and committed (SQLite:
  one transaction, a savepoint each; the file store: one fsync group).
- :mod:`.inline`: one body per read: :func:`~.inline.try_inline` runs it on the
  event loop's thread under a :class:`~.inline.Budget`, and the caller reruns the
  same body on a worker when it reports that it would block.
- :mod:`.finalizer`: :func:`~.finalizer.when_collected`, the release of a store's
  threads when the store is collected unclosed.
- :mod:`.context`: while telemetry is on, the caller's ``contextvars`` carried to
  the worker thread (:class:`~.context.Carried`), and the :class:`~.context.Notes`
  an operation's span reads back (ran on a worker, group-commit size, bytes).

The modules import nothing of statekeeper outside this package, :mod:`.context`
nothing at all, and :mod:`.worker` nothing inside it but :mod:`.context`: data
flows from the stores down to here.
"""
