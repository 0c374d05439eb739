"""Every transcript in ``docs/cli.md`` is real output: this replays the page.

The page tells one story in one directory (an empty directory, two demo runs,
a copy that gets damaged and repaired, an import, ...). The test runs every
``$ `` command of every ```` ```console ```` block that runs ``statekeeper``, in
page order, in a fresh temporary directory whose path is as long as the page's
``/tmp/skdoc-run``, at 80 columns, with ``statekeeper`` on ``PATH``; stderr is
shown where it was written, as in a terminal. Steps the page describes but does
not show run from hidden ``<!-- transcript-setup: ... -->`` comments: a shell
command, or a named step of :data:`HOOKS`.

What truly varies from run to run is normalised, and nothing else: ids, etags,
stream names, cursors and pids (each page value is mapped to the run's value the
first time it appears, and must stay mapped to it), timestamps, elapsed times,
the lengths of a torn record, and the directory. Spacing and line breaks are not
compared (a pid with more digits widens a table); every word and number is.

To rewrite the page from a run: ``STATEKEEPER_WRITE_CLI_TRANSCRIPTS=1 uv run pytest
tests/cli/test_cli_transcripts.py``, then read the diff.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cli_helpers import UV_MARKS, cli_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
PAGE_DIR = "/tmp/skdoc-run"
WRITE = os.environ.get("STATEKEEPER_WRITE_CLI_TRANSCRIPTS") == "1"

_EVENT = re.compile(
    r"^```console\n(?P<block>.*?)^```$|<!-- transcript-setup: (?P<setup>.*?) -->",
    re.MULTILINE | re.DOTALL,
)
#: Values that differ in every run; a page value maps to one run value.
_TOKEN = re.compile(
    r"demo-\d{8}T\d{6}-[0-9a-f]{4}"  # a demo's stream
    r"|AQAAAA[A-Za-z0-9_-]{10,}"  # a cursor
    r"|(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])"  # an id, a store id
    r"|(?<![0-9a-f])[0-9a-f]{16}(?![0-9a-f])"  # an etag
    r"|(?<=pid )\d+|(?<=\"pid\": )\d+|(?<=\"resume_pid\": )\d+"  # a process id
    r"|\d\d:\d\d:\d\d\.\d{6}"  # a time of day, to the microsecond
)
_VARYING = [
    (re.compile(r"\d{4}-\d\d-\d\d"), "<date>"),
    (re.compile(r"\d\d:\d\d:\d\d\.\d{6}"), "<time>"),
    (re.compile(r"\b\d+:\d\d:\d\d\b"), "<elapsed>"),
    (
        re.compile(r"\d+ bytes long but its prefix says \d+"),
        "<n> bytes long but its prefix says <m>",
    ),
    (re.compile(r"[─━]+"), "─"),
    (re.compile(r"\s+"), ""),
]


def _whole(token: str) -> re.Pattern[str]:
    """``token`` where it stands whole: not inside a longer name, hex string or number
    (a time may follow the ``T`` of an ISO timestamp)."""
    edge = r"[\w-]" if token[0].isalpha() else r"[0-9a-f]"
    return re.compile(rf"(?<!{edge}){re.escape(token)}(?!{edge})")


def _maf_checkpoints(run: Path) -> None:
    """An Agent Framework FileCheckpointStorage directory: three checkpoints and a
    torn file."""
    from agent_framework import FileCheckpointStorage, WorkflowCheckpoint

    root = run / "maf-checkpoints"
    root.mkdir()
    storage = FileCheckpointStorage(root)
    for i in range(3):
        checkpoint = WorkflowCheckpoint(
            workflow_name="orders",
            graph_signature_hash="sig",
            checkpoint_id=f"cp-{i}",
            timestamp=f"2026-12-01T10:00:0{i}.000000+00:00",
            state={"step": i},
            iteration_count=i,
        )
        asyncio.run(storage.save(checkpoint))
    (root / "torn.json").write_text('{"checkpoint_id": "torn", "work', "utf-8")


HOOKS: dict[str, Callable[[Path], None]] = {"maf-checkpoints": _maf_checkpoints}


@dataclass
class Replay:
    run: Path
    env: dict[str, str]
    mapping: dict[str, str] = field(default_factory=dict)
    status: int = 0
    problems: list[str] = field(default_factory=list)

    def to_run(self, text: str) -> str:
        """Page values in ``text`` replaced by this run's."""
        for page, ours in sorted(self.mapping.items(), key=lambda kv: -len(kv[0])):
            text = _whole(page).sub(ours, text)
        return text.replace(PAGE_DIR, str(self.run))

    def to_page(self, text: str) -> str:
        """This run's values in ``text`` replaced by the page's (for rewriting it)."""
        back = {ours: page for page, ours in self.mapping.items()}
        for ours, page in sorted(back.items(), key=lambda kv: -len(kv[0])):
            text = _whole(ours).sub(page, text)
        return text.replace(str(self.run), PAGE_DIR)

    def learn(self, page: str, ours: str, where: str) -> None:
        found, got = _TOKEN.findall(page), _TOKEN.findall(ours)
        if len(found) != len(got):
            return  # the comparison reports the difference
        for a, b in zip(found, got, strict=True):
            if self.mapping.setdefault(a, b) != b:
                self.problems.append(f"{where}: {a} was {self.mapping[a]}, now {b}")

    def shell(self, command: str) -> str:
        if command.strip() == "echo $?":
            return f"{self.status}\n"
        proc = subprocess.run(
            ["bash", "-c", command],
            cwd=self.run,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
            check=False,
        )
        self.status = proc.returncode
        return proc.stdout


def _run_dir() -> Path:
    """A new directory whose path is as long as the page's, so that lines wrap alike."""
    base = Path(tempfile.gettempdir())
    length = len(PAGE_DIR) - len(str(base)) - 1
    for _ in range(100):
        path = base / ("skd" + secrets.token_hex(8))[: max(length, 4)]
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("no free directory name")


def _commands(block: str) -> list[tuple[str, str]]:
    """(command, output) pairs of a console block."""
    pairs: list[tuple[str, str]] = []
    for line in block.splitlines(keepends=True):
        if line.startswith("$ "):
            pairs.append((line[2:].rstrip("\n"), ""))
        elif pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + line)
    return pairs


def _normal(text: str) -> str:
    for pattern, replacement in _VARYING:
        text = pattern.sub(replacement, text)
    return text


def _environment(run: Path) -> dict[str, str]:
    env = cli_env(unset=(*UV_MARKS, "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"))
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "COLUMNS": "80",
            "LINES": "50",
            "PYTHONUNBUFFERED": "1",
            "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
            "HOME": str(run),
        }
    )
    env.pop("TERM", None)
    return env


def test_every_transcript_on_the_cli_page_is_what_the_command_line_prints() -> None:
    text = DOC.read_text("utf-8")
    run = _run_dir()
    try:
        _replay(text, run)
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _replay(text: str, run: Path) -> None:
    replay = Replay(run, _environment(run))
    rewritten: list[str] = []
    last = 0
    mismatches: list[str] = []
    for event in _EVENT.finditer(text):
        if event["setup"] is not None:
            step = event["setup"].strip()
            if step in HOOKS:
                HOOKS[step](run)
            else:
                replay.shell(replay.to_run(step))
                assert replay.status == 0, f"setup {step!r} failed"
            continue
        block = event["block"]
        if not block.startswith("$ ") or block.startswith("$ pip "):
            continue  # output only, or an installation
        new_block = ""
        for command, page_output in _commands(block):
            ours = replay.shell(replay.to_run(command))
            replay.learn(page_output, ours, command)
            expected = _normal(replay.to_run(page_output))
            if expected != _normal(ours):
                mismatches.append(f"$ {command}\n--- page:\n{page_output}--- printed:\n{ours}")
            printed = "".join(f"{line.rstrip()}\n" for line in replay.to_page(ours).splitlines())
            new_block += f"$ {replay.to_page(replay.to_run(command))}\n{printed}"
        rewritten.append(text[last : event.start("block")] + new_block)
        last = event.end("block")
    if WRITE:
        DOC.write_text("".join(rewritten) + text[last:], "utf-8")
    assert not replay.problems, replay.problems
    assert not mismatches, "\n\n".join(mismatches)
