"""``statekeeper sweep`` and ``statekeeper compact`` (SPEC S17) in real subprocesses,
on file and SQLite stores."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import statekeeper
from cli_helpers import run_cli
from statekeeper import BaseCheckpointStore, NewCheckpoint
from statekeeper.cli.retention import parse_duration

URLS: dict[str, Callable[[Path], str]] = {
    "file": lambda d: f"file://{d / 'store'}",
    "sqlite": lambda d: f"sqlite:///{d / 'store.db'}",
}


@pytest.fixture(params=sorted(URLS))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return URLS[request.param](tmp_path)


def with_store(url: str, action: Callable[[BaseCheckpointStore], Any], **options: Any) -> Any:
    async def main() -> Any:
        async with statekeeper.open_store(url, **options) as store:
            return await action(store)

    return asyncio.run(main())


async def _history(store: BaseCheckpointStore) -> None:
    """Two streams, "a" and "b", of five checkpoints each (by the store's clock)."""
    await store.save_many([NewCheckpoint(stream=s, state=n) for n in range(5) for s in ("a", "b")])


async def _counts(store: BaseCheckpointStore) -> dict[str, int]:
    return {s: len((await store.list(s, limit=100)).items) for s in await store.list_streams()}


def test_parse_duration() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration("90") == parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2w") == timedelta(days=14)
    for bad in ("0", "3x", "-1d", "d", ""):
        with pytest.raises(Exception, match="is not a duration"):
            parse_duration(bad)


def test_sweep_dry_run_then_sweep(url: str, tmp_path: Path) -> None:
    old = datetime.now(UTC) - timedelta(days=40)
    with_store(url, _history, clock=lambda: old)
    with_store(url, lambda s: s.save("new", {"fresh": True}))

    dry = run_cli("sweep", url, "--keep-last", "2", "--idle", "30d", "--dry-run", cwd=tmp_path)
    assert dry.out.strip() == (
        "dry run: would remove 10 checkpoints (2 whole idle streams); nothing was changed"
    )
    assert with_store(url, _counts) == {"a": 5, "b": 5, "new": 1}

    report = run_cli(
        "sweep", "--url", url, "--keep-last", "2", "--max-age", "7d", "--json", cwd=tmp_path
    ).json()
    assert report["policy"] == {"keep_last": 2, "max_age": "7d", "idle": None}
    assert (report["checkpoints_removed"], report["streams_removed"]) == (8, 0)
    assert report["dry_run"] is False and report["seconds"] >= 0
    assert report["url"].endswith(("store", "store.db"))
    if url.startswith("sqlite"):
        assert isinstance(report["bytes_reclaimed"], int)
    assert with_store(url, _counts) == {"a": 1, "b": 1, "new": 1}

    text = run_cli("sweep", url, "--idle", "30d", cwd=tmp_path).out
    assert text.startswith("removed 2 checkpoints (2 whole idle streams)")
    assert with_store(url, _counts) == {"new": 1}


def test_sweep_usage_errors(tmp_path: Path) -> None:
    url = URLS["sqlite"](tmp_path)
    with_store(url, _history)
    none = run_cli("sweep", url, "--json", cwd=tmp_path, expect=2).json()
    assert "at least one of --keep-last" in none["error"]["message"]
    bad = run_cli("sweep", url, "--max-age", "3x", cwd=tmp_path, expect=2)
    assert "is not a duration" in bad.err
    run_cli("sweep", url, "--keep-last", "0", cwd=tmp_path, expect=2)
    both = run_cli("sweep", url, "--url", url, "--keep-last", "1", cwd=tmp_path, expect=2)
    assert "once" in both.err
    assert with_store(url, _counts) == {"a": 5, "b": 5}


def test_compact_shrinks_an_sqlite_file(tmp_path: Path) -> None:
    url = URLS["sqlite"](tmp_path)
    path = tmp_path / "store.db"

    async def fill(store: BaseCheckpointStore) -> None:
        for start in range(0, 3000, 1000):
            await store.save_many(
                [
                    NewCheckpoint(stream=f"s{n % 10}", state="x" * 400)
                    for n in range(start, start + 1000)
                ]
            )

    with_store(url, fill)
    before = os.path.getsize(path)
    run_cli("sweep", url, "--keep-last", "1", cwd=tmp_path)
    after_sweep = os.path.getsize(path)
    assert after_sweep < before / 4  # incremental auto-vacuum gave the pages back
    result = run_cli("compact", url, "--json", cwd=tmp_path).json()
    assert result["backend"] == "sqlite" and isinstance(result["bytes_reclaimed"], int)
    assert os.path.getsize(path) <= after_sweep


def test_compact_elsewhere_says_what_the_backend_does(tmp_path: Path) -> None:
    url = URLS["file"](tmp_path)
    with_store(url, _history)
    result = run_cli("compact", "--url", url, cwd=tmp_path)
    assert result.out.strip() == (
        "nothing to compact: the file store gives space back as it removes files"
    )
