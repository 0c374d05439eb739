"""A throwaway PostgreSQL server for the server-crash test: its own data directory in a
temp dir, its own free port on 127.0.0.1, and a postmaster this process can SIGKILL.

``initdb`` and ``postgres`` refuse to run as root, so when the tests run as root
(as CI and the development machine do) the server runs as the ``postgres`` system
user (or ``nobody``), in a temp dir that user owns; otherwise as the current user.
The binaries are looked up in ``/usr/lib/postgresql/<version>/bin`` (newest first),
then next to ``pg_config --bindir`` and ``initdb`` on ``PATH``.

Every process of the server that this module sees is remembered with its start time,
so cleanup ends exactly those (never a process that reused a pid), and
:meth:`ScratchPostgres.destroy` always leaves no server and no directory behind.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

#: Programs the server needs, all from one ``bin`` directory.
PROGRAMS = ("initdb", "postgres", "pg_isready")
#: Users the server may run as when this process is root (first that exists).
SERVER_USERS = ("postgres", "nobody")


def _version_key(path: Path) -> tuple[int, ...]:
    parts = path.parent.name.split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def find_bindir() -> Path | None:
    """The newest PostgreSQL ``bin`` directory holding every program in :data:`PROGRAMS`."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in PROGRAMS):
            return bindir
    return None


def server_user() -> pwd.struct_passwd | None:
    """Who runs the server: ``None`` for "this process's user" (not root); the first
    of :data:`SERVER_USERS` when root; raises ``LookupError`` if root has none."""
    if os.geteuid() != 0:
        return None
    for name in SERVER_USERS:
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            if entry.pw_uid != 0:
                return entry
    raise LookupError(f"running as root and none of the users {SERVER_USERS} exists")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _temp_parent() -> str:
    """A temp dir that another user can reach (pytest's own temp dirs are 0700 root)."""
    base = Path(tempfile.gettempdir()).resolve()
    for part in (base, *base.parents):
        if not part.stat().st_mode & stat.S_IXOTH:
            return "/tmp"
    return str(base)


def _stat_fields(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of ``pid`` from ``/proc``; ``None`` once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


class ScratchPostgres:
    """One PostgreSQL server in a temp dir (see the module docstring).

    Use :meth:`create`, then :meth:`start`; :meth:`crash` SIGKILLs the postmaster and
    waits until its children noticed and exited (so the next :meth:`start` runs crash
    recovery on the same data directory); :meth:`destroy` always cleans up.
    """

    def __init__(
        self, bindir: Path, user: pwd.struct_passwd | None, settings: Mapping[str, str]
    ) -> None:
        self.bindir = bindir
        self.user = user
        self.settings = dict(settings)
        self.root = Path(tempfile.mkdtemp(prefix="sk-pgcrash-", dir=_temp_parent()))
        if user is not None:
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.stragglers = 0  # children that outlived the postmaster by 30 s and were killed
        self._seen: dict[int, int] = {}  # pid -> start time, of every server process seen

    @classmethod
    def create(
        cls,
        bindir: Path,
        user: pwd.struct_passwd | None,
        settings: Mapping[str, str] | None = None,
    ) -> ScratchPostgres:
        """A new server with an initialised data directory (not started); ``settings``
        are extra ``postgres -c name=value`` settings."""
        server = cls(bindir, user, settings or {})
        try:
            server._run(
                "initdb",
                "-D",
                str(server.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
            )
        except BaseException:
            server.destroy()
            raise
        return server

    def url(self, **query: str) -> str:
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres" + (
            f"?{qs}" if qs else ""
        )

    def _as_user(self) -> dict[str, object]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _run(self, program: str, *args: str) -> None:
        out = subprocess.run(
            [str(self.bindir / program), *args],
            cwd=self.root,
            capture_output=True,
            timeout=120,
            check=False,
            **self._as_user(),  # type: ignore[arg-type]
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({out.returncode}): {out.stdout.decode(errors='replace')}"
                f"{out.stderr.decode(errors='replace')}"
            )

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, timeout: float = 60.0) -> None:
        """Start the postmaster and wait until it accepts connections."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.root),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    # the durability under test: these are the defaults, made explicit
                    "-c",
                    "fsync=on",
                    "-c",
                    "synchronous_commit=on",
                    "-c",
                    "full_page_writes=on",
                    "-c",
                    "shared_buffers=16MB",
                    "-c",
                    "max_connections=40",
                    *[arg for k, v in self.settings.items() for arg in ("-c", f"{k}={v}")],
                ],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # the test's Ctrl-C must not reach the server; destroy() stops it
                start_new_session=True,
                **self._as_user(),  # type: ignore[arg-type]
            )
        self._remember(self.proc.pid)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"postgres exited ({self.proc.returncode}) while starting:\n"
                    + self.log_text()[-3000:]
                )
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                timeout=30,
                check=False,
            )
            if ready.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not come up in {timeout:.0f} s")
            time.sleep(0.1)

    def _remember(self, pid: int) -> None:
        fields = _stat_fields(pid)
        if fields is not None:
            self._seen[pid] = fields[2]

    def _children(self, parent: int) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                fields = _stat_fields(int(entry.name))
                if fields is not None and fields[0] == parent:
                    found.append(int(entry.name))
        return found

    def _alive(self, pid: int) -> bool:
        """Whether ``pid`` is still the server process seen before (not a reused pid),
        and not a zombie (a container's init may never reap them)."""
        fields = _stat_fields(pid)
        return fields is not None and fields[1] != "Z" and fields[2] == self._seen.get(pid)

    def crash(self, timeout: float = 30.0) -> int:
        """SIGKILL the postmaster, as an OOM killer or a crash would; returns its pid.

        Stopped first so it forks no child between the listing of its children and
        the kill; then waits until those children (backends, checkpointer, WAL
        writer, ...) saw their postmaster die and exited, as they do by themselves,
        so a restart finds the data directory free.
        """
        assert self.proc is not None and self.proc.poll() is None, "not running"
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)
        children = self._children(pid)
        for child in children:
            self._remember(child)
        os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout)
        self._wait_gone(children, timeout)
        return pid

    def _wait_gone(self, pids: list[int], timeout: float) -> None:
        """Wait for ``pids`` to exit; SIGKILL what outlives ``timeout`` (counted)."""
        if self._wait(pids, timeout):
            return
        for p in pids:
            if self._alive(p):
                self.stragglers += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        if not self._wait(pids, timeout):
            raise RuntimeError(f"server processes {pids} survive SIGKILL")

    def _wait(self, pids: list[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(self._alive(p) for p in pids):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Immediate shutdown (SIGQUIT), then SIGKILL for anything left of the server."""
        if self.proc is not None and self.proc.poll() is None:
            for child in self._children(self.proc.pid):
                self._remember(child)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for pid in list(self._seen):
            if self._alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._wait_gone(list(self._seen), timeout)

    def destroy(self) -> None:
        """Stop the server (if running) and remove its directory. Safe to call twice."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
