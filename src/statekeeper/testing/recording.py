"""Recording what a workload did, for the checkers in ``invariants`` and ``history``.

Two records, for two kinds of test:

- A **write log** (:class:`LogWriter`, :class:`LoggedStore`, read back as a
  :class:`WriteLog`) for crash and fault tests. Each save, update and delete is
  announced (``begin``) before the store is called and its outcome (``ack`` or
  ``err``) is recorded after, as JSON lines that survive the workload's death:
  fsynced to a file, or sent down a pipe or socket to the parent. What was
  acknowledged is what the application was told, and so what must survive.
- A **history** (:class:`HistoryRecorder`, :class:`RecordingStore`, read back as a
  :class:`History` of :class:`Event` values) for concurrency tests: every call,
  reads included, with its invocation and response times and its result.

Times are ``time.monotonic_ns()``, which is system-wide on Linux, so records of
several processes on one host can be merged and compared.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.interface import CheckpointStore
from ..errors import (
    CheckpointEncodeError,
    CheckpointNotFound,
    InvalidQuery,
    PreconditionFailed,
)
from ..models import Checkpoint

__all__ = [
    "DEFINITE_ERRORS",
    "Event",
    "History",
    "HistoryRecorder",
    "LogWriter",
    "LoggedOp",
    "LoggedStore",
    "RecordingStore",
    "WriteLog",
]

#: Errors after which the contract says nothing was written. Any other error
#: (a BackendError, an OSError, a timeout) leaves the operation in doubt: the
#: checker then allows both outcomes, exactly as for an operation cut by a kill.
DEFINITE_ERRORS: tuple[type[BaseException], ...] = (
    PreconditionFailed,
    CheckpointNotFound,
    InvalidQuery,
    CheckpointEncodeError,
)

# -- writing the log (in the workload process) ------------------------------------------


class LogWriter:
    """Appends write-log entries as JSON lines to a file, a pipe or a socket.

    With a path, every entry is written with one ``write`` and fsynced (unless
    ``durable=False``), so an entry that returned is on disk before the store call
    that it announces starts. With a file descriptor the entry goes to the kernel
    at once; a parent reading a pipe or socket gets it even if this process is
    killed right after. A socket is written with ``send``, so it does not count
    among the ``write`` calls that a crash-point test injects faults into.

    Not thread-safe; use one writer per task or process.
    """

    def __init__(
        self, target: str | os.PathLike[str] | int, *, writer: str = "w", durable: bool = True
    ) -> None:
        self.session = f"{writer}:{os.getpid()}:{secrets.token_hex(3)}"
        self._n = 0
        self._durable = durable
        self._sock: socket.socket | None = None
        if isinstance(target, int):
            self._fd = target
            self._owns_fd = False
            self._fsync = False
            if stat.S_ISSOCK(os.fstat(target).st_mode):
                self._sock = socket.socket(fileno=os.dup(target))
        else:
            self._fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._owns_fd = True
            self._fsync = durable
            # a previous writer killed mid-line must not glue its torn tail to our entry
            size = os.fstat(self._fd).st_size
            if size:
                with open(target, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        self._emit(b"\n")

    def close(self) -> None:
        """Close the socket, and the file if this writer opened it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._owns_fd and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def _emit(self, data: bytes) -> None:
        if self._sock is not None:
            self._sock.sendall(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        if self._fsync:
            os.fsync(self._fd)

    def _entry(self, event: str, n: int, fields: Mapping[str, Any]) -> None:
        entry = {"ev": event, "s": self.session, "n": n, "t": time.monotonic_ns(), **fields}
        self._emit(json.dumps(entry, separators=(",", ":"), allow_nan=False).encode() + b"\n")

    def begin(self, op: str, **fields: Any) -> int:
        """Announce an operation before it is attempted; returns its number."""
        self._n += 1
        self._entry("begin", self._n, {"op": op, **fields})
        return self._n

    def ack(self, n: int, **fields: Any) -> None:
        """Record that operation ``n`` returned (``id``, ``seq``, ``etag``, ``removed``)."""
        self._entry("ack", n, fields)

    def fail(self, n: int, exc: BaseException) -> None:
        """Record that operation ``n`` raised; whether that error means "nothing written"."""
        definite = isinstance(exc, DEFINITE_ERRORS)
        self._entry("err", n, {"error": type(exc).__name__, "definite": definite})


class LoggedStore:
    """A store wrapper that logs ``save``/``update``/``delete`` for :func:`check_invariants`.

    States must be plain JSON (dict, list, str, int, float, bool, None) so that the
    log can hold them exactly.
    """

    def __init__(self, store: CheckpointStore, log: LogWriter) -> None:
        self.store = store
        self.log = log

    async def save(
        self,
        stream: str,
        state: Any,
        *,
        id: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Checkpoint:
        n = self.log.begin("save", stream=stream, id=id, state=state, tags=dict(tags or {}))
        try:
            cp = await self.store.save(stream, state, id=id, tags=tags)
        except BaseException as exc:
            self.log.fail(n, exc)
            raise
        self.log.ack(n, id=cp.id, seq=cp.sequence, etag=cp.etag)
        return cp

    async def update(self, id: str, state: Any, *, if_match: str | None = None) -> Checkpoint:
        n = self.log.begin("update", id=id, state=state, if_match=if_match)
        try:
            cp = await self.store.update(id, state, if_match=if_match)
        except BaseException as exc:
            self.log.fail(n, exc)
            raise
        self.log.ack(n, id=cp.id, seq=cp.sequence, etag=cp.etag)
        return cp

    async def delete(self, id: str, *, if_match: str | None = None) -> bool:
        n = self.log.begin("delete", id=id, if_match=if_match)
        try:
            removed = await self.store.delete(id, if_match=if_match)
        except BaseException as exc:
            self.log.fail(n, exc)
            raise
        self.log.ack(n, removed=removed)
        return removed


# -- reading the log -----------------------------------------------------------------


@dataclass(frozen=True)
class LoggedOp:
    """One operation from the write log, with its outcome.

    ``outcome`` is ``"ack"`` (returned), ``"err"`` (raised) or ``None`` (cut off:
    the process died before it could record an outcome). ``definite`` is true
    for an ``err`` whose error guarantees nothing was written.
    """

    session: str
    n: int
    op: str
    t_begin: int
    id: str | None = None
    stream: str | None = None
    state: Any = None
    tags: Mapping[str, str] = field(default_factory=dict)
    if_match: str | None = None
    outcome: str | None = None
    t_end: int | None = None
    sequence: int | None = None
    etag: str | None = None
    removed: bool | None = None
    error: str | None = None
    definite: bool = False

    @property
    def acked(self) -> bool:
        """Whether the store call returned (the write was acknowledged)."""
        return self.outcome == "ack"

    @property
    def in_doubt(self) -> bool:
        """Cut off, or failed with an error that does not rule out a write."""
        return self.outcome is None or (self.outcome == "err" and not self.definite)


class WriteLog:
    """The operations of one or more write logs, ordered by their ``begin`` time."""

    def __init__(self, ops: Iterable[LoggedOp], *, torn_lines: int = 0) -> None:
        self.ops = sorted(ops, key=lambda op: (op.t_begin, op.session, op.n))
        self.torn_lines = torn_lines

    @classmethod
    def read(cls, *paths: str | os.PathLike[str]) -> WriteLog:
        """Parse log files (missing files count as empty)."""
        chunks = []
        for path in paths:
            try:
                chunks.append(Path(path).read_bytes())
            except FileNotFoundError:
                continue
        return cls.parse(b"".join(chunk + b"\n" for chunk in chunks))

    @classmethod
    def parse(cls, data: bytes) -> WriteLog:
        """Parse JSON-lines log data; torn lines (a kill mid-write) are counted and skipped."""
        begins: dict[tuple[str, int], dict[str, Any]] = {}
        ends: dict[tuple[str, int], dict[str, Any]] = {}
        torn = 0
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                key = (entry["s"], entry["n"])
                event = entry["ev"]
            except (ValueError, KeyError, TypeError):
                torn += 1
                continue
            if event == "begin":
                begins[key] = entry
            elif event in ("ack", "err"):
                ends[key] = entry
        ops = []
        for key, b in begins.items():
            e = ends.get(key, {})
            ops.append(
                LoggedOp(
                    session=key[0],
                    n=key[1],
                    op=b["op"],
                    t_begin=b["t"],
                    id=e.get("id") or b.get("id"),
                    stream=b.get("stream"),
                    state=b.get("state"),
                    tags=b.get("tags") or {},
                    if_match=b.get("if_match"),
                    outcome=e.get("ev"),
                    t_end=e.get("t"),
                    sequence=e.get("seq"),
                    etag=e.get("etag"),
                    removed=e.get("removed"),
                    error=e.get("error"),
                    definite=bool(e.get("definite", False)),
                )
            )
        return cls(ops, torn_lines=torn)

    @property
    def streams(self) -> list[str]:
        """The streams the logged operations touched, sorted."""
        return sorted({op.stream for op in self.ops if op.stream is not None})


# -- recording -------------------------------------------------------------------------


class HistoryRecorder:
    """Appends timed events as JSON lines to ``path`` (one ``write`` per event)."""

    def __init__(self, path: str | os.PathLike[str], proc: str) -> None:
        self.proc = proc
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def close(self) -> None:
        """Close the file; closing twice does nothing."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def write(self, event: Mapping[str, Any]) -> None:
        """Append one event as a JSON line, tagged with this process's name."""
        data = json.dumps({"proc": self.proc, **event}, separators=(",", ":")).encode() + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


def _brief(cp: Checkpoint) -> dict[str, Any]:
    return {"id": cp.id, "seq": cp.sequence, "etag": cp.etag, "state": cp.state}


class RecordingStore:
    """A store wrapper that records every call, with its timing, in a history.

    Exceptions are recorded and re-raised. Only one call per wrapper may be in
    flight at a time if the history is to be meaningful per ``proc``; use one
    wrapper (and one ``proc`` name) per concurrent task.
    """

    def __init__(self, store: CheckpointStore, recorder: HistoryRecorder) -> None:
        self.store = store
        self.rec = recorder

    async def _call(self, op: str, args: dict[str, Any], coro: Any, brief: Any) -> Any:
        inv = time.monotonic_ns()
        try:
            value = await coro
        except Exception as exc:
            self.rec.write(
                {
                    "op": op,
                    "args": args,
                    "inv": inv,
                    "res": time.monotonic_ns(),
                    "ok": False,
                    "error": type(exc).__name__,
                    "definite": isinstance(exc, DEFINITE_ERRORS),
                }
            )
            raise
        res = time.monotonic_ns()
        self.rec.write(
            {"op": op, "args": args, "inv": inv, "res": res, "ok": True, "result": brief(value)}
        )
        return value

    async def save(self, stream: str, state: Any, *, id: str | None = None) -> Checkpoint:
        args = {"stream": stream, "id": id, "state": state}
        cp: Checkpoint = await self._call(
            "save", args, self.store.save(stream, state, id=id), _brief
        )
        return cp

    async def update(self, id: str, state: Any, *, if_match: str | None = None) -> Checkpoint:
        args = {"id": id, "state": state, "if_match": if_match}
        cp: Checkpoint = await self._call(
            "update", args, self.store.update(id, state, if_match=if_match), _brief
        )
        return cp

    async def delete(self, id: str) -> bool:
        removed: bool = await self._call("delete", {"id": id}, self.store.delete(id), bool)
        return removed

    async def load(self, id: str) -> Checkpoint:
        cp: Checkpoint = await self._call("load", {"id": id}, self.store.load(id), _brief)
        return cp

    async def get_latest(self, stream: str) -> Checkpoint | None:
        cp: Checkpoint | None = await self._call(
            "get_latest",
            {"stream": stream},
            self.store.get_latest(stream),
            lambda c: None if c is None else _brief(c),
        )
        return cp

    async def walk(
        self, stream: str, *, order: str = "asc", limit: int = 5, max_pages: int = 1000
    ) -> int:
        """Page through ``stream`` with cursors, recording each page; returns pages read."""
        walk = f"{self.rec.proc}/{time.monotonic_ns()}"
        cursor: str | None = None
        bound: int | None = None
        for page_no in range(max_pages):
            args = {
                "stream": stream,
                "order": order,
                "limit": limit,
                "walk": walk,
                "page": page_no,
                "bound": bound,
            }
            page = await self._call(
                "page",
                args,
                self.store.list(stream, limit=limit, order=order, after=cursor),  # type: ignore[arg-type]
                lambda p: {
                    "items": [[c.id, c.sequence, c.etag] for c in p.items],
                    "skipped": [s.sequence for s in p.skipped],
                    "has_more": p.has_more,
                },
            )
            if page.next_cursor is None:
                return page_no + 1
            positions = [c.sequence for c in page.items] + [
                s.sequence for s in page.skipped if s.sequence is not None
            ]
            bound = max(positions) if order == "asc" else min(positions)
            cursor = page.next_cursor
        return max_pages


# -- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One recorded call: invoked at ``inv``, returned (or raised) at ``res`` (ns)."""

    proc: str
    op: str
    args: Mapping[str, Any]
    inv: int
    res: int
    ok: bool
    result: Any = None
    error: str | None = None
    definite: bool = False

    @property
    def in_doubt(self) -> bool:
        """A write that raised an error that does not rule out that it was applied."""
        return not self.ok and not self.definite


class History:
    """Events merged from the files of several processes, in invocation order."""

    def __init__(self, events: Iterable[Event]) -> None:
        self.events = sorted(events, key=lambda e: (e.inv, e.proc))

    @classmethod
    def read(cls, *paths: str | os.PathLike[str]) -> History:
        """Parse the JSON-lines files of a :class:`HistoryRecorder` into one history."""
        events = []
        for path in paths:
            for line in Path(path).read_bytes().splitlines():
                if line.strip():
                    d = json.loads(line)
                    events.append(
                        Event(
                            proc=d["proc"],
                            op=d["op"],
                            args=d.get("args", {}),
                            inv=d["inv"],
                            res=d["res"],
                            ok=d["ok"],
                            result=d.get("result"),
                            error=d.get("error"),
                            definite=bool(d.get("definite", False)),
                        )
                    )
        return cls(events)

    def of(self, op: str) -> list[Event]:
        """The events of one operation (``"save"``, ``"get_latest"``, ...), in order."""
        return [e for e in self.events if e.op == op]
