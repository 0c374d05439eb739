"""Helpers for the command line tests: run ``statekeeper`` in a real subprocess, and
seed or damage a store through the public API and the kit's raw-record backdoor."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import statekeeper
from statekeeper import BaseCheckpointStore, Checkpoint
from statekeeper.record import StoredRecord

TESTS = Path(__file__).resolve().parent
ENTRY = [sys.executable, "-m", "statekeeper.cli.entry"]
# Runs the command line with two extra backends registered in code, the way an
# application registers a plugin: "seeded" is an in-memory store that fills itself
# on open, "seeded-bad" is the same with two damaged records.
SEEDED = [sys.executable, "-c", "import cli_helpers; cli_helpers.seeded_main()"]
# Each run imports pydantic and SQLAlchemy afresh. Where bytecode writing is off
# (PYTHONDONTWRITEBYTECODE), that costs seconds of CPU per run, so the subprocesses
# share a bytecode cache outside the repository and the environment.
PYCACHE = (
    Path(tempfile.gettempdir())
    / f"statekeeper-cli-tests-pycache-{getattr(os, 'getuid', lambda: 0)()}"
)


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(
    *args: str,
    cwd: Path,
    expect: int | None = 0,
    env: dict[str, str] | None = None,
    entry: list[str] | None = None,
    timeout: float = 120,
    unset: tuple[str, ...] = (),
) -> Result:
    """Run the command line in a subprocess and check its exit status.

    ``unset`` names environment variables to take away. Without ``--debug`` no
    output may contain a traceback, whatever happened.
    """
    full_env = cli_env(env, unset)
    proc = subprocess.run(
        [*(entry or ENTRY), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if expect is not None:
        assert result.code == expect, f"exit {result.code}, wanted {expect}: {result}"
    if "--debug" not in args:
        assert "Traceback" not in result.out + result.err, result
    return result


def cli_env(env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment the command line runs in: this one, without a store URL."""
    skip = {"STATEKEEPER_URL", "PYTHONDONTWRITEBYTECODE", *unset}
    full_env = {k: v for k, v in os.environ.items() if k not in skip}
    # This checkout's code, also when the tests run from a copy of the tests.
    path = os.pathsep.join([str(TESTS), str(TESTS.parent / "src")])
    full_env.update({"COLUMNS": "200", "PYTHONPATH": path, "PYTHONPYCACHEPREFIX": str(PYCACHE)})
    full_env.update(env or {})
    return full_env


#: Marks of ``uv run``: without them a printed hint names the program plainly.
UV_MARKS = ("UV", "UV_RUN_RECURSION_DEPTH")


def hint_lines(out: str, marker: str) -> list[str]:
    """The commands printed after ``marker`` (e.g. ``"next page:"``), one per line."""
    return [line.split(marker, 1)[1].strip() for line in out.splitlines() if marker in line]


def run_hint(
    hint: str, *, cwd: Path, expect: int | None = 0, env: dict[str, str] | None = None
) -> Result:
    """Run a command the command line printed, as a POSIX shell would split it."""
    proc = subprocess.run(
        shlex.split(hint),
        cwd=cwd,
        env=env if env is not None else cli_env(unset=UV_MARKS),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if expect is not None:
        assert result.code == expect, f"{hint!r}: exit {result.code}, wanted {expect}: {result}"
    return result


async def seed(store: BaseCheckpointStore) -> dict[str, list[Checkpoint]]:
    """Three streams, saved interleaved; tags, metadata, parent links, a non-JSON state.

    Ids are fixed (``orders-1`` .. ``orders-5``, ``users-2``, ``users-4``, ``odd-1``)
    and sequences are 1..8 in a fresh store: orders 1, 2, 4, 5, 7, users 3, 6, odd 8.
    """
    made: dict[str, list[Checkpoint]] = {"orders": [], "users": [], "odd name/with:colon": []}
    for step in range(1, 6):
        prev = made["orders"][-1].id if made["orders"] else None
        made["orders"].append(
            await store.save(
                "orders",
                {
                    "step": step,
                    "items": list(range(step)),
                    "at": datetime(2024, 1, step, tzinfo=UTC),
                },
                tags={"kind": "final" if step == 5 else "step"},
                metadata={"n": step, "note": "plain JSON"},
                parent_id=prev,
                id=f"orders-{step}",
            )
        )
        if step in (2, 4):
            made["users"].append(
                await store.save("users", {"name": f"user{step}"}, id=f"users-{step}")
            )
    made["odd name/with:colon"].append(
        await store.save("odd name/with:colon", {"ok": True}, tags={"kind": "step"}, id="odd-1")
    )
    return made


async def damage(store: BaseCheckpointStore, torn: str, undecodable: str) -> None:
    """Tear the record ``torn`` (truncated write) and give ``undecodable`` a state the
    codec refuses inside an intact, correctly checksummed envelope."""
    raw = await store.backdoor_read_raw(torn)
    await store.backdoor_write_raw(torn, raw[:-7])
    record = StoredRecord.from_bytes(await store.backdoor_read_raw(undecodable), location="test")
    bad = dataclasses.replace(record, state=b'{"$sk":"os:system","v":"echo pwned"}')
    await store.backdoor_write_raw(undecodable, bad.to_bytes(store.store_id))


def register_seeded() -> None:
    """Register the ``seeded`` and ``seeded-bad`` backends in this process."""
    import statekeeper
    from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage

    class SeededStore(MemoryCheckpointStore):
        damaged = False

        def __init__(self, **options: Any) -> None:
            # The same identity in every process, so a cursor from one run works in the next.
            storage = MemoryStorage(store_id="seeded", cursor_key=b"k" * 32)
            super().__init__(storage=storage, **options)

        async def open(self) -> None:
            if not self.is_open and self.storage.high_water_mark == 0:
                # Seeded through a writable twin on the same storage, so that a
                # store the command line opens with read_only=True still has data.
                async with MemoryCheckpointStore(storage=self.storage) as writer:
                    made = await seed(writer)
                    if self.damaged:
                        await damage(writer, made["orders"][-1].id, made["users"][0].id)
            await super().open()

    class DamagedStore(SeededStore):
        damaged = True

    statekeeper.register_backend("seeded", SeededStore)
    statekeeper.register_backend("seeded-bad", DamagedStore)


def seeded_main() -> None:
    """The ``statekeeper`` command line with the ``seeded`` and ``seeded-bad`` backends."""
    from statekeeper.cli.entry import main

    register_seeded()
    main()


#: What ``copy`` keeps of every checkpoint (the sequence is the destination's own).
HEADER_FIELDS = (
    "id",
    "stream",
    "created_at",
    "updated_at",
    "etag",
    "parent_id",
    "tags",
    "metadata",
    "expires_at",
)


def everything(url: str) -> list[Checkpoint]:
    """Every live checkpoint of the store at ``url``, in global sequence order, read
    read-only; none may be unreadable."""

    async def main() -> list[Checkpoint]:
        async with statekeeper.open_store(url, read_only=True) as store:
            items: list[Checkpoint] = []
            cursor = None
            while True:
                page = await store.list(None, limit=100, order="asc", after=cursor)
                assert not page.skipped
                items += page.items
                cursor = page.next_cursor
                if cursor is None:
                    return items

    return asyncio.run(main())


def assert_copied(original: list[Checkpoint], got: list[Checkpoint], where: str = "") -> None:
    """``got`` holds the checkpoints of ``original``, in the same order, with every
    header field but the sequence and the same state (value and type)."""
    assert [cp.id for cp in got] == [cp.id for cp in original], where  # relative order
    for a, b in zip(original, got, strict=True):
        assert {f: getattr(a, f) for f in HEADER_FIELDS} == {
            f: getattr(b, f) for f in HEADER_FIELDS
        }, where
        assert a.state == b.state and type(a.state) is type(b.state), where
