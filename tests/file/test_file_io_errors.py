"""I/O errors (EIO, ENOSPC) injected at every write, fsync, rename, truncate,
unlink and mkdir of save, update, delete and prune on the file backend: each time
a typed error with the OS error in ``.orig``, no temp file left, older data
intact, the operation all-or-nothing (save, update) or finishable (delete), and
the store usable at once."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from fault_io import FaultHookIO

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.errors import BackendError, CheckpointNotFound, StatekeeperError
from statekeeper.models import Checkpoint

pytestmark = pytest.mark.reliability


class FaultIO(FaultHookIO):
    """The real file system, failing the k-th mutating call with ``errno`` once."""

    FAULTED = frozenset(
        {"write", "pwrite", "fsync", "fdatasync", "rename", "ftruncate", "unlink", "mkdir"}
    )

    def __init__(self) -> None:
        self.armed: tuple[int, int] | None = None
        self.calls = 0
        self.fired = False

    def arm(self, k: int, code: int) -> None:
        self.armed, self.calls, self.fired = (k, code), 0, False

    def _fault(self, op: str) -> None:
        if self.armed is None:
            return
        self.calls += 1
        k, code = self.armed
        if self.calls == k:
            self.armed, self.fired = None, True
            raise OSError(code, os.strerror(code), op)


def _temp_files(root: Path) -> list[Path]:
    """Temp files holding bytes (an empty one is the writer's spare: file/spares.py)."""
    return [p for p in root.rglob("*") if p.name.endswith(".tmp") and p.stat().st_size]


async def _consistent(store: FileCheckpointStore, before: dict[str, Checkpoint]) -> None:
    for cid, cp in before.items():
        got = await store.load(cid)
        assert (got.state, got.etag, got.sequence) == (cp.state, cp.etag, cp.sequence)


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
@pytest.mark.parametrize("operation", ["save", "update", "delete", "prune"])
async def test_io_error_at_every_step_leaves_the_store_intact(
    tmp_path: Path, operation: str, code: int
) -> None:
    """Fail the 1st, 2nd, ... mutating call of one operation. Each time: a typed
    error with the OS error in ``.orig``, no temp file, the older checkpoints as
    they were, the operation all-or-nothing, and the store usable at once."""
    io = FaultIO()
    root = tmp_path / "store"
    async with FileCheckpointStore(root, io=io) as store:
        k = 0
        while True:
            k += 1
            assert k < 60, "the operation never completed"
            keep = [await store.save("job", {"n": n}) for n in range(2)]
            target = await store.save("job", {"n": "target"})
            before = {cp.id: cp for cp in (*keep, target)}
            io.arm(k, code)
            error: BackendError | None = None
            try:
                if operation == "save":
                    result: Any = await store.save("job", {"n": "new"}, id=f"new-{k}")
                elif operation == "update":
                    result = await store.update(target.id, {"n": "changed"})
                elif operation == "delete":
                    result = await store.delete(target.id)
                else:
                    result = await store.prune("job", keep_last=1)
            except BackendError as exc:
                error = exc
            io.armed = None
            failed = error is not None
            if error is not None:
                assert io.fired
                assert isinstance(error.orig, OSError), error
                assert error.orig.errno == code, error
            assert _temp_files(root) == [], f"temp file left after failing call {k}"
            latest = await store.get_latest("job")
            if not failed:
                assert not io.fired or operation in ("delete", "prune")
            if operation == "save":
                present = await _exists(store, f"new-{k}")
                assert present == (not failed), f"call {k}: half-done save"
                await _consistent(store, before)
                assert latest is not None
                assert latest.id == (f"new-{k}" if present else target.id)
            elif operation == "update":
                got = await store.load(target.id)
                assert got.state in ({"n": "target"}, {"n": "changed"})
                if failed:
                    assert got.state == {"n": "target"}, f"call {k}: failed update applied"
                await _consistent(store, {c: cp for c, cp in before.items() if c != target.id})
            else:
                survivors = {c: cp for c, cp in before.items() if await _exists(store, c)}
                await _consistent(store, survivors)
                if failed and operation == "delete":
                    assert latest is not None and latest.id in (target.id, keep[-1].id)
            usable = await store.save("job", {"n": "after"})
            assert (await store.get_latest("job")) == usable
            await store.delete_stream("job")
            if not failed:
                assert not io.fired and result is not None
                break
    async with FileCheckpointStore(root) as reopened:
        assert (await reopened.list(None)).skipped == []


async def _exists(store: FileCheckpointStore, cid: str) -> bool:
    try:
        await store.load(cid)
    except CheckpointNotFound:
        return False
    return True


@pytest.mark.asyncio
async def test_errors_are_typed_statekeeper_errors(tmp_path: Path) -> None:
    io = FaultIO()
    async with FileCheckpointStore(tmp_path / "s", io=io) as store:
        io.arm(1, errno.ENOSPC)
        with pytest.raises(StatekeeperError) as caught:
            await store.save("job", {})
        assert isinstance(caught.value, BackendError)
        assert "ENOSPC" in str(caught.value)
        assert caught.value.__cause__ is caught.value.orig
