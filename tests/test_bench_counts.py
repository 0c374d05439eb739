"""The benchmarks' counts (benchmarks/skbench/stores.py): WAL frames per commit,
from the WAL file's growth checked against the frames SQLite reports, on real
SQLite databases whose frames per commit are known from SQLite's file format."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from skbench.stores import (
    FRAME_HEADER,
    WAL_HEADER,
    count_wal_frames,
    frames_per_commit,
)


def test_frames_per_commit_is_the_wal_growth_in_frames_over_the_commits() -> None:
    page = 4096
    assert frames_per_commit(WAL_HEADER + 6 * (page + FRAME_HEADER), page, 6, 3) == 2.0
    assert frames_per_commit(WAL_HEADER + 7 * (page + FRAME_HEADER), page, 7, 2) == 3.5
    assert frames_per_commit(0, page, 0, 5) == 0.0  # nothing written: no WAL yet


def test_a_wal_that_started_over_or_is_not_whole_frames_is_refused() -> None:
    page = 4096
    with pytest.raises(ValueError, match="SQLite reports 2"):
        frames_per_commit(WAL_HEADER + 6 * (page + FRAME_HEADER), page, 2, 3)
    with pytest.raises(ValueError, match="not whole frames"):
        frames_per_commit(WAL_HEADER + 6 * (page + FRAME_HEADER) + 1, page, 6, 3)
    with pytest.raises(ValueError, match="no commits"):
        frames_per_commit(0, page, 0, 0)


def _writer(db: Path, autocheckpoint: int) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, v TEXT)")
    return conn


@pytest.mark.parametrize("autocheckpoint", [1000, 2])
def test_a_commit_that_changes_one_page_counts_one_frame(
    tmp_path: Path, autocheckpoint: int
) -> None:
    # a few short rows fit the table's one leaf page, and the file does not grow:
    # each commit writes that page alone. With an automatic checkpoint every 2
    # pages, the WAL would start over every other commit, were it not held.
    db = tmp_path / "t.db"
    conn = _writer(db, autocheckpoint)
    rows = iter(range(100))

    async def commit() -> None:
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row {next(rows)}",))

    try:
        assert asyncio.run(count_wal_frames(db, commit, commits=20)) == 1.0
    finally:
        conn.close()
