"""The report of statekeeper's test runs: skips counted by reason, and a heartbeat.

``tests/conftest.py`` loads this plugin for every run under ``tests/``; the ``redis``
session of the noxfile loads it with ``-p statekeeper_progress``.

**Skips.** Without the server variables hundreds of tests skip, and ``-ra`` (our
``addopts``) would list each one, burying the one failure. This plugin takes the
skips out of pytest's short summary and prints a section before it instead, one
line per reason with its count::

    ========================= 503 skipped, by reason ==========================
     312  STATEKEEPER_TEST_POSTGRES_URL is not set; set it to a postgres URL ...

A skip that means a whole check did not happen is also said on the run's last
line, where a reader looks first: the browser checks of ``tests/test_site.py``
without Chromium end the run with ``..., N skipped, M not checked in a browser
(no Chromium) in ...s`` (:data:`_ON_THE_LAST_LINE`).

Failures, errors, xfails and xpasses are listed exactly as pytest lists them.
``--list-skips`` brings back pytest's line per skipped test. A skip turned into a
failure (``STATEKEEPER_REQUIRE_SERVICES=1``) is a failure, and listed as one.

**Heartbeat.** When no test has started or finished for 30 seconds
(``STATEKEEPER_TEST_HEARTBEAT`` sets another number of seconds; ``0`` turns it off),
a line says which tests are still running, for how long, and how far the run is::

    ... still running after 2m30s: tests/test_x.py::test_y (1m05s); 412 of 1530 done

and another one every interval while nothing moves. A run whose tests keep
starting and finishing prints none. The line goes to a duplicate of the original standard
output, taken before any test runs, so pytest's output capture does not swallow it.
Under pytest-xdist it is the controller that reports, naming every running test.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

__all__ = ["HEARTBEAT_ENV"]

HEARTBEAT_ENV = "STATEKEEPER_TEST_HEARTBEAT"
# tests/test_run_report.py: the file created after each heartbeat line, so its test
# can wait for the line instead of guessing how long that takes
_MARK_ENV = "STATEKEEPER_TEST_HEARTBEAT_MARK"
_DEFAULT_INTERVAL = 30.0
#: Skip reasons (by how they start) said again on the run's last line, and how.
_ON_THE_LAST_LINE = {"no Chromium at ": "not checked in a browser (no Chromium)"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--list-skips",
        action="store_true",
        default=False,
        help="list every skipped test (pytest's -rs) instead of counting skips by reason",
    )


def _without_skips(reportchars: str) -> str:
    """``reportchars`` (pytest's ``-r``) with the skips taken out, aliases expanded."""
    out = ""
    for char in reportchars:
        if char == "a":
            out = "xXEf"
        elif char == "A":
            out = "PpxXEf"
        elif char == "N":
            out = ""
        elif char not in "sS" and char not in out:
            out += char
    # an empty -r means pytest's default ("fE"); "N" means none
    return out or "N"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # tryfirst: before the terminal reporter reads the report characters
    if not config.getoption("--list-skips"):
        config.option.reportchars = _without_skips(config.option.reportchars or "")
    interval = _interval()
    # an xdist worker's output is not shown; its controller reports for it
    if interval > 0 and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Heartbeat(interval), "statekeeper-heartbeat")


def _interval() -> float:
    raw = os.environ.get(HEARTBEAT_ENV, "")
    if not raw:
        return _DEFAULT_INTERVAL
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"{HEARTBEAT_ENV}={raw!r} is not a number of seconds") from None


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.skipped]
    for start, words in _ON_THE_LAST_LINE.items():
        # pytest's last line counts every key of stats: these reports, again, under words
        said = [r for r in skipped if _skip_reason(r).startswith(start)]
        if said:
            terminalreporter.stats[words] = said
    if config.getoption("--list-skips") or not skipped:
        return
    counts = Counter(_skip_reason(report) for report in skipped)
    terminalreporter.section(f"{len(skipped)} skipped, by reason", sep="=")
    width = len(str(max(counts.values())))
    for reason, count in counts.most_common():
        terminalreporter.write_line(f"{count:>{width}}  {reason}")
    terminalreporter.write_line("(--list-skips lists each skipped test)")


def _span(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class _Heartbeat:
    """A daemon thread that writes a line when no test has started or finished for a while."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.lock = threading.Lock()
        self.running: dict[str, float] = {}
        self.done = 0
        self.total: int | None = None
        self.start = self.last_news = time.monotonic()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.fd = -1

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # fd 1 is the real standard output here: pytest captures only around tests
        self.fd = os.dup(1)
        self.thread = threading.Thread(target=self._beat, name="statekeeper-heartbeat", daemon=True)
        self.thread.start()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items) or self.total

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.total = len(ids)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.running[nodeid] = self.last_news = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        with self.lock:
            self.running.pop(nodeid, None)
            self.done += 1
            self.last_news = time.monotonic()

    def pytest_sessionfinish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _beat(self) -> None:
        while not self.stop.wait(self._until_due()):
            with self.lock:
                now = time.monotonic()
                if now - self.last_news < self.interval or not self.running:
                    continue
                self.last_news = now
                line = self._line(now)
            os.write(self.fd, line.encode("utf-8", "replace"))
            mark = os.environ.get(_MARK_ENV)
            if mark:
                Path(mark).touch()

    def _until_due(self) -> float:
        with self.lock:
            return max(0.05, self.last_news + self.interval - time.monotonic())

    def _line(self, now: float) -> str:
        tests = ", ".join(
            f"{nodeid} ({_span(now - began)})"
            for nodeid, began in sorted(self.running.items(), key=lambda item: item[1])
        )
        total = f" of {self.total}" if self.total else ""
        # on a line of its own: pytest may be half way through a line of dots
        return (
            f"\n... still running after {_span(now - self.start)}: {tests}; "
            f"{self.done}{total} done\n"
        )
