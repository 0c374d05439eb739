"""Helpers shared by the file backend's tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file import layout as fmt
from statekeeper.backends.file.store import FileParts


def parts_of(store: FileCheckpointStore) -> FileParts:
    """``store``'s engine and the parts over it (:class:`FileParts`), to call one
    part directly with a budget of the test's choosing."""
    return store._parts


def read_state(root: Path | str) -> fmt.State | None:
    """The store's ``state``, read from its file (``None``: unreadable)."""
    return fmt.State.from_bytes((Path(root) / "state").read_bytes())


def write_state(root: Path | str, state: fmt.State) -> None:
    """Write ``state`` into the store's ``state`` file as a writer does: the copy its
    generation owns (another writer's write, as the store sees it)."""
    offset, data = state.copy_bytes()
    with (Path(root) / "state").open("r+b") as f:
        f.seek(offset)
        f.write(data)


def count_hops(store: FileCheckpointStore) -> list[str]:
    """Record the name of every worker hop ``store`` makes from now on (the list
    grows), saves to the writer thread included."""
    hops: list[str] = []
    run = store._run

    async def counted(what: str, func: Any, *args: Any) -> Any:
        hops.append(what)
        return await run(what, func, *args)

    store._run = counted  # type: ignore[method-assign]
    saves, save = store._saves, store._saves.save

    def counted_save(insert: Any, record: Any) -> Any:
        hops.append("save")  # a save's hop is to the writer thread (its group commit)
        return save(insert, record)

    saves.save = counted_save  # type: ignore[method-assign]
    return hops


@contextmanager
def a_journal_in_flight(
    store: FileCheckpointStore, root: Path, op: str, seq: int
) -> Iterator[None]:
    """``store``'s state with a journal entry of ``op`` for ``job.idx`` (as a writer
    that crashed, or is still running, leaves it), put back as it was after."""
    path = root / "state"
    before = path.read_bytes()
    state = read_state(root)
    assert state is not None
    lo, hi = state.hwm + 1, state.hwm + 2
    write_state(root, state.next(hwm=hi, journal=fmt.Journal(op, "job.idx", seq=seq, lo=lo, hi=hi)))
    try:
        yield
    finally:
        path.write_bytes(before)
