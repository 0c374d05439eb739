"""Servers of the connection-fault suite's own, and the workload it runs through faults.

``scratch_postgres`` (a PostgreSQL server in a temp dir) is reused; here are what the
suite adds around it:

- :func:`restart` stops a server with ``pg_ctl``'s shutdown modes (``fast``: SIGINT,
  ``immediate``: SIGQUIT) and starts it again on the same port and data directory;
- :class:`ScratchPgBouncer`, a PgBouncer in transaction mode in front of one, with a
  small server pool so that clients share server connections, and
  ``ignore_startup_parameters`` for the session settings a direct connection sends
  (the configuration that made it drop them silently, issue 36);
- :class:`ScratchRedis`, a Redis with AOF (``appendfsync always``) on a free port;
- :class:`Tally` and :func:`run_workload`: 4 writers and 2 readers on one store,
  counted by what they saw, checked at the end against what was acknowledged.

Every server runs as the user ``scratch_postgres`` picks (PgBouncer, like
PostgreSQL, refuses root) and is stopped and removed by the fixture that made it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratch_postgres import ScratchPostgres, _temp_parent, free_port

from statekeeper import BaseCheckpointStore
from statekeeper.errors import (
    CheckpointNotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StatekeeperError,
)
from statekeeper.models import NewCheckpoint

SIGNALS = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def shutdown(server: ScratchPostgres, mode: str, timeout: float = 60.0) -> None:
    """Stop ``server`` as ``pg_ctl stop -m <mode>`` would, and wait until every one of
    its processes is gone (so a start finds the port and data directory free)."""
    assert server.proc is not None and server.proc.poll() is None, "not running"
    children = server._children(server.proc.pid)
    for child in children:
        server._remember(child)
    os.kill(server.proc.pid, SIGNALS[mode])
    server.proc.wait(timeout)
    server._wait_gone(children, timeout)


def restart(server: ScratchPostgres, mode: str) -> None:
    shutdown(server, mode)
    server.start()


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited ({proc.returncode}): {log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {port} after {timeout:.0f}s")
        time.sleep(0.05)


class ScratchPgBouncer:
    """PgBouncer in ``pool_mode = transaction`` in front of ``server``."""

    def __init__(self, server: ScratchPostgres, *, pool_size: int = 3) -> None:
        self.server = server
        self.root = Path(tempfile.mkdtemp(prefix="sk-pgbouncer-", dir=_temp_parent()))
        self.port = free_port()
        users = self.root / "users.txt"
        users.write_text('"postgres" ""\n')
        self.log_path = self.root / "pgbouncer.log"
        self.ini = self.root / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 400\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits,lock_timeout,"
            "synchronous_commit,default_transaction_read_only\n"
            f"logfile = {self.log_path}\n"
        )
        if server.user is not None:
            for path in (self.root, users, self.ini):
                os.chown(path, server.user.pw_uid, server.user.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        user = self.server.user
        extra: dict[str, Any] = (
            {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        )
        self.proc = subprocess.Popen(
            [binary, str(self.ini)],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **extra,
        )
        _wait_port(self.port, self.proc, self.log_path)

    def url(self, **query: str) -> str:
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres" + (
            f"?{qs}" if qs else ""
        )

    def destroy(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(30)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class ScratchRedis:
    """``redis-server`` with AOF (``appendfsync always``) on a free port, in a temp dir."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sk-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--dir", str(self.root)],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        _wait_port(self.port, self.proc, self.root / "none.log")

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def destroy(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(30)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Tally:
    """What the workload's calls saw, and what the end check found."""

    raised: collections.Counter[str] = field(default_factory=collections.Counter)
    unknown: int = 0  # calls that raised OutcomeUnknown (signalled)
    acked: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (stream, step)
    failed_ids: dict[str, str] = field(default_factory=dict)  # saves reported not done
    wrong: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    unsignalled: list[str] = field(default_factory=list)
    non_retryable: list[str] = field(default_factory=list)
    verify_ok: bool | None = None

    def saw(self, exc: BaseException) -> None:
        self.raised[type(exc).__name__] += 1
        if isinstance(exc, OutcomeUnknown):
            self.unknown += 1
        if not getattr(exc, "retryable", False):
            self.non_retryable.append(f"{type(exc).__name__}: {exc}")

    def summary(self) -> dict[str, Any]:
        return {
            "raised": dict(self.raised),
            "acknowledged": len(self.acked),
            "unknown outcomes (signalled)": self.unknown,
            "lost": len(self.lost),
            "wrong answers": len(self.wrong),
            "duplicates": len(self.duplicates),
            "unsignalled unknown outcomes": len(self.unsignalled),
            "verify clean": self.verify_ok,
        }

    def assert_clean(self) -> None:
        details = (
            self.summary(),
            self.wrong[:5],
            self.lost[:5],
            self.non_retryable[:5],
            self.unsignalled[:5],
        )
        assert not self.lost, details
        assert not self.wrong, details
        assert not self.duplicates, details
        assert not self.unsignalled, details
        assert not self.non_retryable, details
        assert self.verify_ok, details


async def _save_step(store: Any, tally: Tally, stream: str, step: int, writer: int) -> None:
    """Save one step until it is acknowledged or known to be stored. A save that raised
    OutcomeUnknown is retried with the same id (PreconditionFailed then means the first
    landed); one that raised anything else said it did not land: the next try takes a
    new id, and the end check looks for the old one (an unsignalled unknown)."""
    attempt = 0
    cid = f"w{writer}-s{step}-a{attempt}"
    in_doubt = False  # cid got OutcomeUnknown: only the same id again, until resolved
    while True:
        try:
            await store.save(stream, {"w": writer, "step": step}, id=cid)
            tally.acked[cid] = (stream, step)
            return
        except PreconditionFailed as exc:
            if not in_doubt:  # no earlier try of this id may have landed
                tally.wrong.append(f"save of a new id {cid} raised {exc}")
            got = await _retrying(tally, lambda c=cid: store.load(c))
            if got.state != {"w": writer, "step": step}:
                tally.wrong.append(f"{cid} holds {got.state!r}")
            tally.acked[cid] = (stream, step)
            return
        except OutcomeUnknown as exc:
            tally.saw(exc)
            in_doubt = True
        except StatekeeperError as exc:
            tally.saw(exc)
            if not in_doubt:
                tally.failed_ids[cid] = f"{type(exc).__name__}: {exc}"
                attempt += 1
                cid = f"w{writer}-s{step}-a{attempt}"
        await asyncio.sleep(0.02)


async def _retrying(tally: Tally, call: Callable[[], Awaitable[Any]]) -> Any:
    for _ in range(500):
        try:
            return await call()
        except StatekeeperError as exc:
            if isinstance(exc, CheckpointNotFound):
                raise
            tally.saw(exc)
            await asyncio.sleep(0.02)
    raise AssertionError("the server never came back")


async def _reader(store: Any, tally: Tally, streams: list[str], stop: asyncio.Event) -> None:
    """get_latest never older than the newest step acknowledged before the call; load
    of an acknowledged id returns its state."""
    while not stop.is_set():
        for w, stream in enumerate(streams):
            floor = max((s for cid, (st, s) in tally.acked.items() if st == stream), default=-1)
            known = [cid for cid, (st, _) in tally.acked.items() if st == stream]
            try:
                latest = await store.get_latest(stream)
                got = -1 if latest is None else latest.state["step"]
                if got < floor:
                    tally.wrong.append(f"get_latest({stream}) = step {got} < acknowledged {floor}")
                if known:
                    cid = known[len(known) // 2]
                    loaded = await store.load(cid)
                    if loaded.state["step"] != tally.acked[cid][1] or loaded.state["w"] != w:
                        tally.wrong.append(f"load({cid}) = {loaded.state!r}")
            except CheckpointNotFound as exc:
                tally.wrong.append(f"acknowledged {exc.id} not found")
            except StatekeeperError as exc:
                tally.saw(exc)
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.005)


async def run_workload(
    store: Any,
    fault: Callable[[], Awaitable[None]],
    *,
    steps_before: int = 15,
    steps_after: int = 15,
    writers: int = 4,
    readers: int = 2,
) -> Tally:
    """``writers`` tasks save steps to their own streams; ``fault`` runs once every
    writer has ``steps_before`` steps acknowledged, while they go on saving, and they
    stop once each has ``steps_after`` more acknowledged after it. ``readers`` tasks
    check reads meanwhile. Then the end check: every acknowledged step is stored
    (lost), no step twice (duplicates), no save reported failed is stored
    (unsignalled unknown), and ``verify`` is clean."""
    tally = Tally()
    streams = [f"faults-w{w}" for w in range(writers)]
    reached = [asyncio.Event() for _ in range(writers)]
    faulted = asyncio.Event()
    stop = asyncio.Event()

    async def writer(w: int) -> None:
        # saves go on while the fault happens; then steps_after more once it is over
        step, after = 0, 0
        while after < steps_after:
            if step == steps_before:
                reached[w].set()
            await _save_step(store, tally, streams[w], step, w)
            step += 1
            after += faulted.is_set()

    async def inject() -> None:
        for event in reached:
            await event.wait()
        await fault()
        faulted.set()

    reading = [asyncio.create_task(_reader(store, tally, streams, stop)) for _ in range(readers)]
    try:
        await asyncio.gather(inject(), *(writer(w) for w in range(writers)))
    finally:
        stop.set()
        await asyncio.gather(*reading)
    await check_stored(store, tally, streams)
    return tally


async def check_stored(store: Any, tally: Tally, streams: list[str]) -> None:
    stored: dict[str, tuple[str, int]] = {}
    for stream in streams:
        cursor = None
        while True:
            page = await _retrying(
                tally, lambda c=cursor, s=stream: store.list(s, order="asc", limit=200, after=c)
            )
            for item in page.items:
                stored[item.id] = (stream, item.state["step"])
            cursor = page.next_cursor
            if not page.has_more or cursor is None:
                break
    tally.lost = sorted(set(tally.acked) - set(stored))
    tally.unsignalled = [f"{i}: {m}" for i, m in tally.failed_ids.items() if i in stored]
    steps = collections.Counter(stored.values())
    tally.duplicates = [f"{s} step {n} x{c}" for (s, n), c in steps.items() if c > 1]
    report = await _retrying(tally, store.verify)
    tally.verify_ok = report.ok


async def every_operation(
    s: BaseCheckpointStore, kill: Callable[[], Awaitable[object]]
) -> list[str]:
    """Each public operation once, after ``kill()`` ended the store's connections;
    returns their names (raises if one raised)."""
    done: list[str] = []
    first = await s.save("ops", {"n": 0}, id="op-0")
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("save", lambda: s.save("ops", {"n": 1}, id="op-1")),
        (
            "save_many",
            lambda: s.save_many([NewCheckpoint(stream="ops", state={"n": 2}, id="op-2")]),
        ),
        ("get_latest", lambda: s.get_latest("ops")),
        ("load", lambda: s.load("op-1")),
        ("load_many", lambda: s.load_many(["op-0", "op-1"])),
        ("list", lambda: s.list("ops")),
        ("list every stream", lambda: s.list(None)),
        ("list_streams", lambda: s.list_streams()),
        ("cursor_at", lambda: s.cursor_at("op-1")),
        ("update", lambda: s.update("op-0", {"n": 10}, if_match=first.etag)),
        ("delete", lambda: s.delete("op-2")),
        ("delete_many", lambda: s.delete_many(["op-1"])),
        ("prune", lambda: s.prune("ops", keep_last=5)),
        ("delete_stream", lambda: s.delete_stream("gone")),
        ("purge_expired", lambda: s.purge_expired()),
        ("info", lambda: s.info()),
        ("verify", lambda: s.verify()),
    ]
    for name, call in calls:
        await kill()
        await call()
        done.append(name)
    return done


def unavailable(reason: str) -> None:
    """Skip, or fail under ``STATEKEEPER_REQUIRE_SERVICES`` (CI has every binary)."""
    import pytest

    from statekeeper.testing.services import require_services

    if require_services():
        pytest.fail(f"{reason} (STATEKEEPER_REQUIRE_SERVICES is set, so this is a failure)")
    pytest.skip(reason)


def postgres_maker() -> tuple[Callable[..., ScratchPostgres], list[ScratchPostgres]]:
    """``(make, made)``: ``make(**settings)`` starts a scratch server (skips, or fails in
    CI, without the binaries); the caller destroys what is in ``made``."""
    import pytest
    from scratch_postgres import find_bindir, server_user

    pytest.importorskip("asyncpg")
    bindir = find_bindir()
    if bindir is None:
        unavailable(
            "no PostgreSQL server binaries (initdb, postgres, pg_isready) in "
            "/usr/lib/postgresql/*/bin, pg_config --bindir or PATH"
        )
    try:
        user = server_user()
    except LookupError as exc:
        unavailable(f"initdb and postgres refuse to run as root: {exc}")
    made: list[ScratchPostgres] = []

    def make(**settings: str) -> ScratchPostgres:
        server = ScratchPostgres.create(bindir, user, settings)  # type: ignore[arg-type]
        made.append(server)
        server.start()
        return server

    return make, made


def pgbouncer_available() -> None:
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists():
        unavailable("no pgbouncer binary (apt-get install pgbouncer; .ci/run installs it)")


async def terminate_store_backends(admin_url: str) -> int:
    """``pg_terminate_backend`` every connection named ``statekeeper`` (the store's
    application_name) on the scratch server at ``admin_url``, as an idle timeout of a
    cloud database does; waits until they are gone. Returns how many there were."""
    import asyncpg

    con = await asyncpg.connect(admin_url)
    try:
        pids = [
            r[0]
            for r in await con.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'statekeeper' "
                "AND pid <> pg_backend_pid()"
            )
        ]
        for pid in pids:
            await con.fetchval("SELECT pg_terminate_backend($1)", pid)
        gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = ANY($1::int[])"
        for _ in range(3000):  # polling another process
            if await con.fetchval(gone, pids):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"backends {pids} outlived pg_terminate_backend")
    finally:
        await con.close()
    for _ in range(3):
        await asyncio.sleep(0.01)  # the store's sockets see their EOF
    return len(pids)
