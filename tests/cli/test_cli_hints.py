"""Commands the command line prints for the user to run next run as printed: the
next and previous page of ``ls`` and ``streams``, and the demo's "look around"
(also after README command 1, ``uv run ... statekeeper demo``, where the console
script is not on the shell's PATH). Each printed command is split as a POSIX
shell splits it and run. Also: ``ls`` across streams at 80 columns."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

import statekeeper
from cli_helpers import UV_MARKS, cli_env, hint_lines, run_cli, run_hint
from statekeeper import BaseCheckpointStore

REPO = Path(__file__).resolve().parents[2]


def _fill(url: str) -> None:
    async def main() -> None:
        async with statekeeper.open_store(url) as store:
            for n in range(1, 6):
                await store.save("-dashed stream", {"n": n}, tags={"k": "v w"}, id=f"d-{n}")
                await store.save("plain", {"n": n}, tags={"k": "v w"}, id=f"p-{n}")
            await store.save("zeta", {"n": 0}, id="z-1")

    asyncio.run(main())


def _ids(out: str) -> list[str]:
    return re.findall(r"\b[dpz]-\d\b", out)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    # a space and a quote in the path: the hint must quote the URL for the shell
    url = "file://" + str(tmp_path / "it's a store")
    _fill(url)
    return url


def test_ls_next_and_previous_page_hints_run_as_printed(store_url: str, tmp_path: Path) -> None:
    args = ("--order", "asc", "--limit", "2", "--tag", "k=v w", "--url", store_url)
    # across streams, and in a stream whose name would pass for an option
    for stream, pages in (
        ((), [["d-1", "p-1"], ["d-2", "p-2"], ["d-3", "p-3"]]),
        (
            ("-dashed stream",),
            [["d-1", "d-2"], ["d-3", "d-4"], ["d-5"]],
        ),
    ):
        first = run_cli("ls", *args, *(["--", *stream] if stream else []), cwd=tmp_path)
        assert _ids(first.out) == pages[0]
        [hint] = hint_lines(first.out, "next page:")
        assert "--url" in hint and "--tag" in hint and "--limit 2" in hint
        second = run_hint(hint, cwd=tmp_path)
        assert _ids(second.out) == pages[1]
        third = run_hint(hint_lines(second.out, "next page:")[0], cwd=tmp_path)
        assert _ids(third.out) == pages[2]
        [back] = hint_lines(third.out, "previous page:")
        assert _ids(run_hint(back, cwd=tmp_path).out) == pages[1]


def test_streams_next_page_hint_keeps_limit_and_url(store_url: str, tmp_path: Path) -> None:
    first = run_cli("streams", "--limit", "1", "--url", store_url, cwd=tmp_path)
    assert "-dashed stream" in first.out and "plain" not in first.out
    [hint] = hint_lines(first.out, "next page:")
    second = run_hint(hint, cwd=tmp_path)
    assert "plain" in second.out and "zeta" not in second.out  # still one per page
    third = run_hint(hint_lines(second.out, "next page:")[0], cwd=tmp_path)
    assert "zeta" in third.out and "next page:" not in third.out


def test_ls_across_streams_at_80_columns_keeps_ids_and_times_whole(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"

    async def fill(store: BaseCheckpointStore) -> list[str]:
        made = []
        for name in ("demo-20261130T092121-d90b", "a-rather-long-stream-name/with/parts"):
            for _ in range(2):
                cp = await store.save(name, {}, tags={"job": "demo", "owner": "someone-long"})
                made.append(cp)
        return [f"{cp.id} {cp.created_at:%H:%M:%S.%f}" for cp in made]

    async def main() -> list[str]:
        async with statekeeper.open_store(url) as store:
            return await fill(store)

    expected = asyncio.run(main())
    out = run_cli("ls", "--url", url, env={"COLUMNS": "80"}, cwd=tmp_path).out
    table = out.split("next page:")[0]
    assert all(len(line) <= 80 for line in table.splitlines())
    for made in expected:
        id, time = made.split()
        assert re.search(rf"^ \d+\s+{id}\s", table, re.MULTILINE), (id, table)
        assert re.search(rf"\s{re.escape(time)}\s", table), (time, table)
    assert "job=demo" in table and "owner" in table  # no column was dropped
    assert re.search(r"^\s+demo-20261130T092121-d90b\s", table, re.MULTILINE)  # under its id


# -- the demo's "look around" -------------------------------------------------------------


def _look_around(out: str) -> list[str]:
    lines = out.split("Look around", 1)[1].splitlines()[1:]
    return [line.strip() for line in lines if line.strip()]


def test_demo_hints_run_from_a_plain_shell_elsewhere(tmp_path: Path) -> None:
    # The console script run by its path, not under uv, outside the project, from a
    # shell whose PATH lacks the venv: the hints name the project (uv run
    # --project), and run as shown.
    script = Path(sys.executable).parent / "statekeeper"
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != script.parent
    )
    shell = cli_env({"PATH": path}, unset=(*UV_MARKS, "VIRTUAL_ENV"))
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    demo = run_hint(f"{script} demo --steps 2 --kill-after 1 --url {url}", cwd=tmp_path, env=shell)
    hints = _look_around(demo.out)
    assert len(hints) == 3
    for hint in hints:
        assert not hint.startswith("statekeeper "), hint  # not on this PATH
        assert hint.endswith(f"--url {url}"), hint
        run_hint(hint, cwd=tmp_path, env=shell)


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.skipif(
    not (REPO / ".venv").is_dir(),
    reason="the checkout has no uv-synced .venv, and this test does not create one",
)
def test_demo_hints_run_as_shown_after_readme_command_1(tmp_path: Path) -> None:
    # README command 1, from the checkout, in a shell without the venv on PATH.
    # No directory that holds a statekeeper script: not this test's venv, and not the
    # checkout's .venv either (CI runs `uv run nox`, which puts it on PATH).
    venv_bin = Path(sys.executable).parent
    path = os.pathsep.join(
        p
        for p in os.environ["PATH"].split(os.pathsep)
        if Path(p) != venv_bin and not (Path(p) / "statekeeper").exists()
    )
    # nox sets UV_PROJECT_ENVIRONMENT to its session's venv; a user's shell has none
    shell = cli_env({"PATH": path}, unset=(*UV_MARKS, "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"))
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    readme = "uv run --frozen --no-dev --extra cli statekeeper demo"
    demo = run_hint(f"{readme} --steps 2 --kill-after 1 --url {url}", cwd=REPO, env=shell)
    hints = _look_around(demo.out)
    assert len(hints) == 3
    for hint in hints:
        assert hint.startswith("uv run --frozen --no-dev --extra cli statekeeper "), hint
        run_hint(hint, cwd=REPO, env=shell)


def test_program_under_uv_with_another_project_environment_names_uv_run(tmp_path: Path) -> None:
    from statekeeper.cli.hints import UV_RUN, program

    project = tmp_path / "checkout"
    (project / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (project / "uv.lock").write_text("")
    elsewhere = tmp_path / "envs" / "session"
    (elsewhere / "bin").mkdir(parents=True)
    (elsewhere / "bin" / "statekeeper").write_text("")
    env = {
        "UV": "/usr/bin/uv",
        "VIRTUAL_ENV": str(elsewhere),
        "UV_PROJECT_ENVIRONMENT": str(elsewhere),
        "PATH": str(elsewhere / "bin"),
    }
    words = program(
        env=env,
        prefix=str(elsewhere),
        executable=str(elsewhere / "bin" / "python"),
        cwd=project / "sub",
    )
    assert words == list(UV_RUN)


# -- "no store here": what is there instead -------------------------------------------------


def _foreign_things(root: Path) -> None:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(root / "graph.db")) as saver:
        saver.setup()
    other = sqlite3.connect(root / "other.db")
    other.execute("CREATE TABLE invoices (n INTEGER)")
    other.commit()
    other.close()
    (root / "notes.txt").write_text("not a database\n")
    from agent_framework import FileCheckpointStorage, WorkflowCheckpoint

    checkpoint = WorkflowCheckpoint(
        workflow_name="orders",
        graph_signature_hash="sig",
        checkpoint_id="c1",
        timestamp="2026-12-01T10:00:00+00:00",
        state={"step": 1},
        iteration_count=1,
    )
    asyncio.run(FileCheckpointStorage(root / "maf-checkpoints").save(checkpoint))


@pytest.mark.parametrize(
    ("url", "says", "runs"),
    [
        (
            "sqlite:///graph.db",
            "is a LangGraph SqliteSaver database",
            ["import", "graph.db", "--from", "langgraph-sqlite"],
        ),
        ("sqlite:///other.db", "SQLite database of another program (tables: invoices)", None),
        ("sqlite:///notes.txt", "the file is not an SQLite database", None),
        ("file:notes.txt", "is a file, not a directory", None),
        (
            "file:maf-checkpoints",
            "is an Agent Framework FileCheckpointStorage directory (1 checkpoint file)",
            ["import", "maf-checkpoints", "--from", "agent-framework"],
        ),
        ("memory://", "memory:// lives only in the process that opens it", None),
    ],
)
def test_no_store_hint_says_what_is_there_instead(
    tmp_path: Path, url: str, says: str, runs: list[str] | None
) -> None:
    """Each used to suggest 'statekeeper demo --url X' (into another program's
    database, a text file, a framework's folder, or memory://)."""
    _foreign_things(tmp_path)
    err = run_cli("info", "--url", url, cwd=tmp_path, expect=1).err
    flat = " ".join(err.split())
    assert says in flat, flat
    assert "demo" not in flat, flat
    if runs is None:
        return
    printed = flat.split("bring it into a store with: ", 1)[1]
    assert all(word in printed for word in runs), printed
    imported = run_hint(printed, cwd=tmp_path, expect=None)
    assert imported.code == 0, imported
