"""``verify`` and ``repair`` on damaged stores, and read-only opens, in real
subprocesses: verify lists every problem, exits 1, writes nothing and never says
"ok" about a store with a problem; repair keeps a damaged acknowledged
checkpoint until ``--drop-damaged``; the commands that only read create nothing
at a path or database that does not exist, and write nothing where one does."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

import statekeeper
from cli_helpers import hint_lines, run_cli, run_hint

VERIFY_KEYS = {"url", "records", "streams", "high_water_mark", "complete", "problems", "ok"}


def cli(*args: str, cwd: Path, expect: int = 0) -> Any:
    return run_cli(*args, "--json", cwd=cwd, expect=expect).json()


def fill(url: str, n: int = 5) -> None:
    async def main() -> None:
        async with statekeeper.open_store(url) as store:
            for k in range(1, n + 1):
                await store.save("job", {"step": k}, id=f"j-{k}")

    asyncio.run(main())


def snapshot(root: Path) -> dict[str, tuple[int, str, int]]:
    """Every file and directory under ``root``: size, content hash, mtime."""
    seen: dict[str, tuple[int, str, int]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        seen[str(path.relative_to(root))] = (st.st_size, digest, st.st_mtime_ns)
    return seen


def tear_newest(store: Path) -> Path:
    """Cut the newest record file of a file store to half its length, as a torn
    write would leave it, after its save returned."""
    newest = max(store.glob("records/*/*.ckpt"))
    os.truncate(newest, newest.stat().st_size // 2)
    return newest


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[str, Path]:
    """A file store with j-1..j-5 in stream "job", the record of j-5 torn."""
    url = f"file://{tmp_path / 'store'}"
    fill(url)
    return url, tear_newest(tmp_path / "store")


def test_verify_lists_the_damage_writes_nothing_and_never_says_ok(
    damaged: tuple[str, Path], tmp_path: Path
) -> None:
    url, torn = damaged
    before = snapshot(tmp_path / "store")
    doc = cli("verify", "--url", url, cwd=tmp_path, expect=1)
    assert set(doc) == VERIFY_KEYS and doc["ok"] is False
    assert doc["records"] == 5 and doc["streams"] == 1
    [problem] = [p for p in doc["problems"] if p["id"] == "j-5"]
    assert problem["kind"] == "damaged-record" and problem["sequence"] == 5
    assert torn.name in problem["location"] and problem["reason"]
    human = run_cli("verify", "--url", url, cwd=tmp_path, expect=1)
    assert "j-5" in human.out and "damaged record" in human.out and torn.name in human.out
    assert "ok" not in human.out.split() and "all readable" not in human.out
    assert "verifying" in human.err  # the progress bar
    [hint] = hint_lines(human.out, "repair what can be rebuilt:")
    assert hint.endswith(f"repair --url {url}")
    assert snapshot(tmp_path / "store") == before  # read-only: not a byte, not an mtime


def test_repair_keeps_a_damaged_checkpoint_until_drop_damaged(
    damaged: tuple[str, Path], tmp_path: Path
) -> None:
    url, torn = damaged
    doc = cli("repair", "--url", url, cwd=tmp_path, expect=1)
    assert doc["ok"] is False and doc["drop_damaged"] is False and doc["dropped"] == []
    assert [(p["id"], p["sequence"]) for p in doc["damaged"]] == [("j-5", 5)]
    assert set(doc) == {"url", "drop_damaged", "records", "rebuilt", "actions", "damaged"} | {
        "dropped",
        "ok",
    }
    # S3a: the acknowledged j-5 is not forgotten; latest never falls back to j-4
    err = cli("latest", "job", "--url", url, cwd=tmp_path, expect=1)["error"]
    assert err["type"] == "CheckpointDecodeError" and err["id"] == "j-5"
    assert torn.exists()

    human = run_cli("repair", "--url", url, cwd=tmp_path, expect=1)
    assert "still damaged" in human.out and "j-5" in human.out
    assert "--drop-damaged" in human.out and "only way" in human.out
    [hint] = hint_lines(human.out, "only way they go away:")
    dropped = run_hint(hint, cwd=tmp_path)  # runs as printed, and drops j-5
    assert "dropped" in dropped.out and "j-5" in dropped.out
    assert "nothing stays damaged" in dropped.out

    latest = cli("latest", "job", "--url", url, cwd=tmp_path)["checkpoint"]
    assert (latest["id"], latest["sequence"]) == ("j-4", 4)
    after = cli("verify", "--url", url, cwd=tmp_path)
    assert after["ok"] is True and after["records"] == 4 and after["high_water_mark"] == 5


def test_repair_of_a_healthy_store_exits_0(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    fill(url, 3)
    human = run_cli("repair", "--url", url, cwd=tmp_path)
    assert "nothing stays damaged" in human.out
    doc = cli("repair", "--url", url, cwd=tmp_path)
    assert (doc["ok"], doc["records"], doc["damaged"], doc["dropped"]) == (True, 3, [], [])
    assert cli("verify", "--url", url, cwd=tmp_path)["ok"] is True


# -- read-only opens ----------------------------------------------------------------------

COMMANDS: list[list[str]] = [
    ["info"],
    ["streams"],
    ["ls"],
    ["show", "some-id"],
    ["latest", "job"],
    ["verify"],
    ["prune", "job", "--keep-last", "1"],
    ["purge"],
    ["repair"],
]


def _missing_urls(tmp: Path) -> dict[str, str]:
    return {
        "file:rel": "file:no/such/store",
        "file:///abs": f"file://{tmp / 'no' / 'such' / 'store'}",
        "sqlite:///abs": f"sqlite:///{tmp / 'nosuch.db'}",
        "sqlite:///rel": "sqlite:///nosuch.db",
    }


@pytest.mark.parametrize("form", sorted(_missing_urls(Path("/x"))))
def test_no_store_there_exits_1_and_creates_nothing(form: str, tmp_path: Path) -> None:
    url = _missing_urls(tmp_path)[form]
    for command in COMMANDS:
        err = cli(*command, "--url", url, cwd=tmp_path, expect=1)["error"]
        assert err["type"] == "StoreNotFound", (command, err)
        assert os.listdir(tmp_path) == [], (command, os.listdir(tmp_path))
    # copy: a missing source is refused before the destination is touched
    err = cli("copy", url, f"file://{tmp_path / 'copy'}", cwd=tmp_path, expect=1)["error"]
    assert err["type"] == "StoreNotFound"
    human = run_cli("info", "--url", url, cwd=tmp_path, expect=1)
    assert human.out == "" and human.err.count("\n") == 1 and human.err.startswith("error: ")
    assert os.listdir(tmp_path) == []


def test_reading_commands_write_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    fill(url, 3)
    before = snapshot(tmp_path / "store")
    for command in (
        ["info"],
        ["streams"],
        ["ls"],
        ["ls", "job"],
        ["show", "j-2"],
        ["latest", "job"],
        ["verify"],
    ):
        run_cli(*command, "--url", url, cwd=tmp_path)
        assert snapshot(tmp_path / "store") == before, command
    run_cli("copy", url, f"sqlite:///{tmp_path / 'copy.db'}", cwd=tmp_path)
    assert snapshot(tmp_path / "store") == before


def test_reading_commands_leave_an_sqlite_database_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    fill(url, 3)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for command in (["info"], ["ls"], ["latest", "job"], ["verify"]):
        run_cli(*command, "--url", url, cwd=tmp_path)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    # SQLite itself may need its WAL index to read a WAL database; nothing else
    assert {p.name for p in tmp_path.iterdir()} <= {"store.db", "store.db-wal", "store.db-shm"}
