"""What the command line checks before it acts, and what it says when it stops: an
import whose source is not there creates no store, a reading command on a missing
store says how to name one in the command line's own words, ``copy`` refuses a
``--url`` it would not use, and an interrupted ``copy`` says how far it got and that
running it again continues. Real subprocesses, on SQLite and file stores."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import statekeeper
from cli_helpers import run_cli, seed


def _seed(url: str) -> None:
    async def main() -> None:
        async with statekeeper.open_store(url) as store:
            await seed(store)

    asyncio.run(main())


# -- import: the source is checked before the target is created -----------------------


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("agent-framework", None),
        ("langgraph-sqlite", None),
        ("langgraph-sqlite", "not sqlite at all\n"),
    ],
)
def test_import_of_a_bad_source_creates_no_target(
    kind: str, make: str | None, tmp_path: Path
) -> None:
    source = tmp_path / "nope"
    if make is not None:
        source.write_text(make)
    result = run_cli(
        "import", str(source), "--from", kind, "--url", "sqlite:///imported2.db",
        cwd=tmp_path, expect=1,
    )  # fmt: skip
    assert str(source) in result.err
    assert not (tmp_path / "imported2.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["nope"] if make else [])


# -- a missing store, in the command line's words --------------------------------------


def test_info_in_an_empty_directory_points_to_url_env_and_demo(tmp_path: Path) -> None:
    result = run_cli("info", cwd=tmp_path, expect=1)
    err = " ".join(result.err.split())
    # the user passed neither; the API's words are not theirs
    assert "create=False" not in err and "read_only" not in err
    assert "--url" in err and "$STATEKEEPER_URL" in err and "statekeeper demo" in err
    assert "statekeeper.db" in err  # which store it looked for
    assert list(tmp_path.iterdir()) == []
    doc = run_cli("info", "--json", cwd=tmp_path, expect=1).json()
    assert doc["error"]["type"] == "StoreNotFound" and "--url" in doc["error"]["message"]


def test_a_mistyped_url_is_named_and_nothing_is_created(tmp_path: Path) -> None:
    result = run_cli("verify", "--url", "file:bakcup", cwd=tmp_path, expect=1)
    err = " ".join(result.err.split())
    assert "create=True" not in err and "read_only" not in err
    assert "bakcup" in err and "--url" in err
    result = run_cli(
        "prune", "s", "--keep-last", "1", "--url", "sqlite:///x.db", cwd=tmp_path, expect=1
    )
    assert "create=False" not in result.err and "x.db" in result.err
    assert list(tmp_path.iterdir()) == []


# -- copy and a global --url ---------------------------------------------------------


def test_copy_refuses_a_global_url_and_says_what_to_pass(tmp_path: Path) -> None:
    src, dst = f"sqlite:///{tmp_path / 'a.db'}", f"file:{tmp_path / 'b'}"
    _seed(src)
    result = run_cli("--url", "sqlite:///other.db", "copy", src, dst, cwd=tmp_path, expect=2)
    err = " ".join(result.err.split())
    assert "--url" in err and "SRC" in err and "DST" in err
    assert not (tmp_path / "b").exists() and not (tmp_path / "other.db").exists()
    doc = run_cli("copy", src, dst, "--url", "x", "--json", cwd=tmp_path, expect=2).json()
    assert doc["error"]["exit_code"] == 2
    run_cli("copy", src, dst, cwd=tmp_path)  # without it, it copies


# -- copy interrupted ------------------------------------------------------------------

#: The command line, with the destination's 4th import_checkpoint preceded by a real
#: SIGINT to this process, as a Ctrl-C in the terminal sends it.
_CTRL_C_ON_4TH = [
    sys.executable,
    "-c",
    "import os, signal, asyncio\n"
    # a shell that starts a job in the background ignores SIGINT for it; a terminal's
    # Ctrl-C reaches Python's own handler, so restore it
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from statekeeper.backends.file import FileCheckpointStore as F\n"
    "real, calls = F.import_checkpoint, []\n"
    "async def import_checkpoint(self, *a, **k):\n"
    "    calls.append(1)\n"
    "    if len(calls) == 4:\n"
    "        os.kill(os.getpid(), signal.SIGINT)\n"
    # wait for the interrupt to end the copy, however late it is handled; only a copy
    # that ignores it hangs here, until run_cli's timeout
    "        await asyncio.Event().wait()\n"
    "    return await real(self, *a, **k)\n"
    "F.import_checkpoint = import_checkpoint\n"
    "from statekeeper.cli.entry import main; main()",
]


def test_an_interrupted_copy_says_how_far_it_got_and_that_a_rerun_continues(
    tmp_path: Path,
) -> None:
    src, dst = f"sqlite:///{tmp_path / 'a.db'}", f"file:{tmp_path / 'b'}"
    _seed(src)  # 8 checkpoints
    result = run_cli("copy", src, dst, cwd=tmp_path, expect=130, entry=_CTRL_C_ON_4TH)
    err = " ".join(result.err.split())
    assert "interrupted" in err
    assert "copied 3" in err and "3 of the source's 8" in err
    assert "again" in err and "continue" in err
    doc = run_cli("copy", src, dst, "--json", cwd=tmp_path, expect=130, entry=_CTRL_C_ON_4TH)
    error = doc.json()["error"]
    assert error["type"] == "KeyboardInterrupt" and error["exit_code"] == 130
    assert (error["copied"], error["already_present"], error["seen"]) == (0, 3, 3)
    # what was copied is whole, and running it again finishes the job
    run_cli("verify", "--url", dst, cwd=tmp_path)
    done = run_cli("copy", src, dst, "--json", cwd=tmp_path).json()
    assert (done["copied"], done["already_present"], done["problems"]) == (5, 3, [])
