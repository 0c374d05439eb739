"""Helpers for the SQL backend's tests: per-test table prefixes, teardown, child processes."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sqlite3
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import statekeeper
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.errors import StatekeeperError
from statekeeper.testing import StoreFactory, service_url


def new_prefix() -> str:
    """A table prefix no other test run uses."""
    return f"t{secrets.token_hex(4)}_"


def run_async_in_thread(coro_fn: Any) -> Any:
    """Run ``coro_fn()`` on a fresh event loop on its own thread, from sync code.

    Teardown code uses this so that it never touches the event loop pytest-asyncio
    manages for the tests.
    """
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(asyncio.run(coro_fn()))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def drop_store(url: str, prefix: str, **options: Any) -> None:
    """Drop the tables of the store ``prefix`` at ``url``."""
    run_async_in_thread(
        lambda: SqlCheckpointStore.from_url(url, table_prefix=prefix, **options).drop_tables()
    )


def server_factory(service: str) -> Iterator[StoreFactory]:
    """A ``store_factory`` over a fresh prefix on a real server; drops it afterwards."""
    url = service_url(service)
    prefix = new_prefix()
    yield lambda **options: SqlCheckpointStore.from_url(url, table_prefix=prefix, **options)
    drop_store(url, prefix)


def wipe_store(url: str, prefix: str) -> None:
    """Empty every table of a store, meta and counter included.

    The next open then finds an empty meta table, completes the creation (as after
    an interrupted one) and starts a new store: new store id, new cursor key,
    sequences from 1. Cheaper than dropping and re-creating the tables per test.
    """
    tables = SqlCheckpointStore.from_url(url, table_prefix=prefix).tables

    async def wipe() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                for table in reversed(tables.all):
                    await conn.execute(table.delete())
        except sa.exc.ProgrammingError:
            pass  # the tables were never created
        finally:
            await engine.dispose()

    run_async_in_thread(wipe)


class ServerStores:
    """Fresh stores for many tests under one table prefix on one server.

    ``factory()`` is a ``store_factory``; after each test the store is wiped, not
    dropped, and ``drop()`` removes the tables at the end.
    """

    def __init__(self, service: str) -> None:
        self.url = service_url(service)
        self.prefix = new_prefix()

    def factory(self) -> Iterator[StoreFactory]:
        url, prefix = self.url, self.prefix
        yield lambda **options: SqlCheckpointStore.from_url(url, table_prefix=prefix, **options)
        wipe_store(url, prefix)

    def drop(self) -> None:
        drop_store(self.url, self.prefix)


@dataclass
class Target:
    """One store location and raw SQL access to its tables, behind the store's back."""

    name: str
    url: str
    prefix: str

    def store(self, **options: Any) -> SqlCheckpointStore:
        return SqlCheckpointStore.from_url(self.url, table_prefix=self.prefix, **options)

    def key(self) -> str:
        """The ``key`` column, quoted (a reserved word)."""
        return "`key`" if self.name == "mysql" else '"key"'

    async def sql(self, statement: str, params: dict[str, Any] | None = None) -> None:
        await self.rows(statement, params, fetch=False)

    async def rows(
        self,
        statement: str,
        params: dict[str, Any] | None = None,
        *,
        fetch: bool = True,
        before: Sequence[str] = (),
    ) -> list[Sequence[Any]]:
        """The rows of ``statement``, run after the ``before`` statements in one
        transaction; text columns decoded (MySQL returns them as bytes)."""
        if self.name == "sqlite":
            path = self.store().path  # type: ignore[attr-defined]

            def run() -> list[Sequence[Any]]:
                conn = sqlite3.connect(path, isolation_level=None)
                try:
                    for setup in before:
                        conn.execute(setup)
                    cursor = conn.execute(statement, params or {})
                    return list(cursor.fetchall()) if fetch else []
                finally:
                    conn.close()

            return await asyncio.to_thread(run)
        engine = create_async_engine(self.url)
        try:
            async with engine.begin() as conn:
                for setup in before:
                    await conn.execute(sa.text(setup))
                result = await conn.execute(sa.text(statement), params or {})
                return [tuple(r) for r in result.all()] if fetch else []
        finally:
            await engine.dispose()


def sql_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """The body of a ``target`` fixture parametrized over ``sqlite``, ``postgres`` and
    ``mysql``; ``postgres_stores`` and ``mysql_stores`` are fixtures (tests/sql/conftest.py)."""
    if request.param == "sqlite":
        yield Target("sqlite", f"sqlite:///{tmp_path / 'store.db'}", "statekeeper_")
        return
    # Skips, naming the variable to set, when the server's URL is not set.
    stores: ServerStores = request.getfixturevalue(f"{request.param}_stores")
    for _ in stores.factory():  # wipes the tables after the test
        yield Target(request.param, stores.url, stores.prefix)


class Child:
    """A forked child process that saves to a store and reports each event as a JSON line."""

    def __init__(self, pid: int, out: IO[str]) -> None:
        self.pid = pid
        self.out = out

    def events(self) -> Iterator[dict[str, Any]]:
        """The child's events as they come (until it exits)."""
        for line in self.out:
            yield json.loads(line)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        self.out.close()
        return os.waitstatus_to_exitcode(status)


async def _child_job(
    out: IO[str],
    url: str,
    options: dict[str, Any],
    stream: str,
    name: str,
    saves: int,
    pad: int,
    batch: int,
) -> None:
    def emit(**event: Any) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    def item(i: int) -> statekeeper.NewCheckpoint:
        state = {"w": name, "i": i, "pad": "x" * pad}
        return statekeeper.NewCheckpoint(stream=stream, state=state, tags={"w": name})

    store = statekeeper.open_store(url, **options)
    async with store:
        emit(opened=store.store_id)
        for i in range(saves):
            try:
                if batch:
                    cps = await store.save_many([item(i * batch + j) for j in range(batch)])
                    emit(seqs=[cp.sequence for cp in cps], ids=[cp.id for cp in cps])
                    continue
                cp = await store.save(
                    stream, {"w": name, "i": i, "pad": "x" * pad}, tags={"w": name}
                )
            except StatekeeperError as exc:
                emit(error=type(exc).__name__, message=str(exc))
            else:
                emit(seq=cp.sequence, id=cp.id)


def start_children(
    url: str,
    *,
    n: int,
    saves: int,
    stream: str = "shared",
    options: dict[str, Any] | None = None,
    pad: int = 0,
    batches: Sequence[int] = (),
) -> list[Child]:
    """Fork ``n`` children that open ``url`` at the same moment and save ``saves`` times each.

    ``batches[i]``, where given and not 0, makes child ``i`` call ``save_many`` with
    that many items ``saves`` times instead (events ``{"seqs": [...], "ids": [...]}``).

    Forked rather than spawned: a fresh interpreter spends seconds importing on a
    loaded machine, and these are real processes all the same (own connections,
    own locks, killable). Call from synchronous tests only (no running event loop).
    """
    go_read, go_write = os.pipe()  # children block on it until the parent closes it
    children = []
    for i in range(n):
        read, write = os.pipe()
        with warnings.catch_warnings():  # 3.12+ warns about forking with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(read)
                os.close(go_write)
                os.read(go_read, 1)
                with os.fdopen(write, "w") as out:
                    batch = batches[i] if i < len(batches) else 0
                    job = _child_job(out, url, options or {}, stream, f"w{i}", saves, pad, batch)
                    asyncio.run(job)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        children.append(Child(pid, os.fdopen(read)))
    os.close(go_read)
    os.close(go_write)
    return children


def finish_children(children: list[Child]) -> list[list[dict[str, Any]]]:
    """Wait for the children; return each one's events. Fails on a non-zero exit."""
    out = []
    for child in children:
        events = list(child.events())
        code = child.wait()
        assert code == 0, f"child {child.pid} exited with {code} (its traceback is on stderr)"
        out.append(events)
    return out
