"""The command line in real subprocesses against persistent stores: every command on
file and SQLite stores, ``verify`` and ``latest`` on planted damage, ``copy`` file ->
SQLite -> file, the demo, and passwords of a server URL that cannot be reached."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statekeeper
from cli_helpers import assert_copied, damage, everything, run_cli, seed
from statekeeper import BaseCheckpointStore

URLS: dict[str, Callable[[Path], str]] = {
    "file": lambda d: f"file://{d / 'store'}",
    "sqlite": lambda d: f"sqlite:///{d / 'store.db'}",
}


@pytest.fixture(params=sorted(URLS))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return URLS[request.param](tmp_path)


def with_store(url: str, action: Callable[[BaseCheckpointStore], Any]) -> Any:
    async def main() -> Any:
        async with statekeeper.open_store(url) as store:
            return await action(store)

    return asyncio.run(main())


def cli(*args: str, cwd: Path, expect: int = 0) -> Any:
    return run_cli(*args, "--json", cwd=cwd, expect=expect).json()


def test_every_command(url: str, tmp_path: Path) -> None:
    with_store(url, seed)
    u = ("--url", url)
    info = cli("info", *u, cwd=tmp_path)
    assert info["backend"] in ("file", "sqlite") and info["store_id"]
    assert info["format_version"] is not None
    assert (info["checkpoints"], info["streams"], info["high_water_mark"]) == (8, 3, 8)
    assert info["capabilities"]["persistent"] and info["capabilities"]["cross_process"]

    streams = cli("streams", *u, cwd=tmp_path)
    assert [(r["name"], r["checkpoints"]) for r in streams["streams"]] == [
        ("odd name/with:colon", 1),
        ("orders", 5),
        ("users", 2),
    ]

    page1 = cli("ls", "orders", "--limit", "3", "--order", "asc", *u, cwd=tmp_path)
    assert [i["id"] for i in page1["items"]] == ["orders-1", "orders-2", "orders-3"]
    assert page1["url"] == info["url"]  # every result names its store
    page2 = cli(
        "ls",
        "orders",
        "--limit",
        "3",
        "--order",
        "asc",
        "--after",
        page1["next_cursor"],
        *u,
        cwd=tmp_path,
    )
    assert [i["id"] for i in page2["items"]] == ["orders-4", "orders-5"]
    assert page2["has_more"] is False and page2["next_cursor"] is None
    shown = cli("show", "orders-3", *u, cwd=tmp_path)["checkpoint"]
    assert shown["parent_id"] == "orders-2" and shown["state"]["items"] == [0, 1, 2]
    latest = cli("latest", "users", *u, cwd=tmp_path)["checkpoint"]
    assert (latest["id"], latest["state"]) == ("users-4", {"name": "user4"})

    assert cli("verify", *u, cwd=tmp_path)["ok"] is True
    assert cli("prune", "orders", "--keep-last", "1", *u, cwd=tmp_path)["removed"] == 4
    assert [cp.id for cp in everything(url) if cp.stream == "orders"] == ["orders-5"]

    async def expiring(store: BaseCheckpointStore) -> None:
        await store.save("short-lived", {"x": 1}, ttl=0.001)
        await asyncio.sleep(0.01)

    with_store(url, expiring)
    assert cli("purge", *u, cwd=tmp_path) == {"url": info["url"], "removed": 1}


def test_verify_and_latest_on_planted_corrupt_records(url: str, tmp_path: Path) -> None:
    with_store(url, seed)
    with_store(url, lambda store: damage(store, "orders-5", "users-2"))
    report = cli("verify", "--url", url, cwd=tmp_path, expect=1)
    assert report["ok"] is False and report["records"] == 8 and report["streams"] == 3
    problems = {p["id"]: p for p in report["problems"] if p["kind"] == "damaged-record"}
    assert set(problems) == {"orders-5", "users-2"}
    assert "torn or truncated" in problems["orders-5"]["reason"]
    assert problems["orders-5"]["location"] and problems["orders-5"]["sequence"] == 7
    assert "os:system" in problems["users-2"]["reason"]

    human = run_cli("verify", "--url", url, cwd=tmp_path, expect=1)
    assert "damaged record" in human.out and "orders-5" in human.out
    assert f"{len(report['problems'])} problems" in human.out

    # The newest of 'orders' is unreadable: latest says so, and never returns orders-4.
    err = cli("latest", "orders", "--url", url, cwd=tmp_path, expect=1)["error"]
    assert err["type"] == "CheckpointDecodeError" and err["id"] == "orders-5"
    assert "orders-4" not in str(err)
    line = run_cli("latest", "orders", "--url", url, cwd=tmp_path, expect=1)
    assert line.out == "" and line.err.count("\n") == 1
    assert line.err.startswith("error: checkpoint 'orders-5'") and "cannot be decoded" in line.err


def test_copy_file_to_sqlite_to_file_keeps_everything(tmp_path: Path) -> None:
    first, middle, last = (
        URLS["file"](tmp_path / "a"),
        URLS["sqlite"](tmp_path),
        URLS["file"](tmp_path / "b"),
    )
    with_store(first, seed)

    async def more(store: BaseCheckpointStore) -> None:
        # an update (updated_at != created_at, new etag) and an expiry that is still ahead
        await store.update("users-2", {"name": "user2", "renamed": True})
        await store.save("users", {"name": "temp"}, ttl=3600, id="users-temp")
        await store.delete("orders-2")

    with_store(first, more)
    original = everything(first)
    assert len(original) == 8

    copied = cli("copy", first, middle, cwd=tmp_path)
    assert (copied["seen"], copied["copied"], copied["already_present"]) == (8, 8, 0)
    assert copied["problems"] == []
    cli("copy", middle, last, cwd=tmp_path)
    for url in (middle, last):
        got = everything(url)
        assert_copied(original, got, url)
        assert got[-1].expires_at is not None

    # Re-running copies nothing and says so; the destination is unchanged.
    again = cli("copy", middle, last, cwd=tmp_path)
    assert (again["copied"], again["already_present"], again["problems"]) == (0, 8, [])
    assert [cp.sequence for cp in everything(last)] == [cp.sequence for cp in got]


def test_copy_reports_conflicts_and_unreadable_records_and_copies_the_rest(tmp_path: Path) -> None:
    source, target = URLS["sqlite"](tmp_path), URLS["file"](tmp_path)
    with_store(source, seed)
    with_store(source, lambda store: damage(store, "orders-5", "users-2"))
    with_store(target, lambda store: store.save("elsewhere", {"mine": 1}, id="orders-1"))
    result = cli("copy", source, target, cwd=tmp_path, expect=1)
    assert result["copied"] == 5 and result["seen"] == 8
    kinds = {p["id"]: p["check"] for p in result["problems"]}
    assert kinds == {"orders-1": "conflict", "orders-5": "source", "users-2": "source"}
    human = run_cli("copy", source, target, cwd=tmp_path, expect=1)
    assert "copied 0, already present 5, not copied 3 (of 8 in the source)" in human.out
    assert "copying" in human.err  # the progress bar


def test_demo_kills_the_job_and_resumes(tmp_path: Path) -> None:
    # The default store: ./statekeeper.db in the working directory.
    first = run_cli("demo", cwd=tmp_path)
    assert (tmp_path / "statekeeper.db").exists()
    assert "SIGKILL" in first.out and "get_latest returns step 5" in first.out
    assert "FAIL" not in first.out and first.out.count("  ok   ") == 6
    # It can run again, on a new stream; --json gives the whole story.
    doc = cli("demo", "--steps", "6", "--kill-after", "2", cwd=tmp_path)
    assert doc["ok"] is True and all(doc["checks"].values())
    assert doc["url"].startswith("sqlite:") and doc["url"].endswith("/statekeeper.db")
    assert doc["stream"].startswith("demo-")
    assert doc["child"]["exit_status"] == -9 and doc["child"]["killed_during_step"] == 3
    assert doc["resumed_from"]["step"] == 2
    history = doc["history"]
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6]
    assert [h["by"] for h in history] == ["job"] * 2 + ["resume"] * 4
    assert [h["sequence"] for h in history] == list(range(11, 17))  # after the first run's 10
    assert doc["final_state"]["step"] == 6 and len(doc["final_state"]["done"]) == 6
    assert len(cli("streams", "--url", "sqlite:///./statekeeper.db", cwd=tmp_path)["streams"]) == 2


def test_demo_on_a_file_store(tmp_path: Path) -> None:
    doc = cli("demo", "--url", URLS["file"](tmp_path), cwd=tmp_path)
    assert doc["ok"] is True and [h["step"] for h in doc["history"]] == list(range(1, 11))


@pytest.mark.parametrize(
    ("url", "modes"),
    [
        ("postgresql+asyncpg://alice:Pg-Secret-pw%2F1@127.0.0.1:1/test", ["", "--json", "--debug"]),
        ("mysql+aiomysql://root:My-Secret-pw%401@127.0.0.1:1/test", ["--debug"]),
    ],
    ids=["postgresql", "mysql"],
)
def test_server_passwords_never_reach_the_terminal(
    url: str, modes: list[str], tmp_path: Path
) -> None:
    # Port 1 refuses the connection: the driver's error, and with --debug its
    # traceback, are printed, and neither may show the password.
    for mode in modes:
        result = run_cli("info", "--url", url, *filter(None, [mode]), cwd=tmp_path, expect=1)
        assert "127.0.0.1" in result.err
        assert "Secret-pw" not in result.out + result.err, result
        if mode == "--json":
            assert result.json()["error"]["exit_code"] == 1


def test_prune_of_a_stream_with_no_checkpoints_says_so_and_exits_1(
    url: str, tmp_path: Path
) -> None:
    """As ``latest`` does (it once said "removed 0 ..., kept the newest 1" and exited 0)."""
    with_store(url, seed)
    u = ("--url", url)
    human = run_cli("prune", "no-such-stream", "--keep-last", "1", *u, cwd=tmp_path, expect=1)
    assert "stream 'no-such-stream' has no checkpoints" in human.err
    assert "kept the newest" not in human.out
    doc = cli("prune", "no-such-stream", "--keep-last", "0", *u, cwd=tmp_path, expect=1)
    assert (doc["stream"], doc["removed"]) == ("no-such-stream", 0)
    # a stream that has checkpoints, with none to remove, is not a problem
    assert cli("prune", "users", "--keep-last", "10", *u, cwd=tmp_path)["removed"] == 0
    assert len([cp for cp in everything(url) if cp.stream == "orders"]) == 5
