"""Texts a newcomer reads: stream names that ``streams`` prints whole (escaped where
needed) at 80 columns, ``ls --tag``'s placeholder, and the conformance kit's reason
for skipping the test of a backend without TTL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

import statekeeper
from statekeeper.backends.memory import MemoryCheckpointStore
from statekeeper.cli.commands import app
from statekeeper.testing import CheckpointStoreTests

runner = CliRunner()

LONG = "langgraph/doc-sync//checkpoints/thread-0001/namespace-alpha-beta-gamma"
ODD = "two\nlines\tand\x1b[31mred\\"


def _store(tmp_path: Path, *names: str) -> str:
    url = f"sqlite:///{tmp_path / 's.db'}"

    async def main() -> None:
        async with statekeeper.open_store(url) as store:
            for name in names:
                await store.save(name, {"n": 1})

    asyncio.run(main())
    return url


def _invoke(*args: str, columns: int = 80) -> str:
    result = runner.invoke(app, list(args), env={"STATEKEEPER_URL": None, "COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("columns", [80, 60])
def test_streams_prints_long_names_whole_on_a_narrow_terminal(tmp_path: Path, columns: int) -> None:
    url = _store(tmp_path, LONG, "short")
    out = _invoke("streams", "--url", url, columns=columns)
    rows = [line for line in out.splitlines() if "short" in line or "langgraph" in line]
    assert len(rows) == 2, out  # one row per stream
    assert LONG in rows[0] and rows[0].split()[1:3] == ["1", "0"], out


def test_streams_escapes_a_name_with_control_characters_into_one_row(tmp_path: Path) -> None:
    url = _store(tmp_path, ODD, "plain\\name")
    out = _invoke("streams", "--url", url)
    assert "\x1b" not in out and "\t" not in out
    rows = [line for line in out.splitlines() if "two" in line or "plain" in line]
    assert len(rows) == 2, out
    assert "two\\nlines\\tand\\x1b[31mred\\\\" in rows[1], out
    # a backslash is escaped too, so that an escaped name cannot pass for another
    assert "plain\\\\name" in rows[0], out
    # --json keeps the exact names
    doc = runner.invoke(app, ["streams", "--url", url, "--json"], env={"STATEKEEPER_URL": None})
    assert ODD in doc.stdout or "two\\nlines" in doc.stdout


def test_ls_help_shows_key_value_for_tag() -> None:
    out = _invoke("ls", "--help", columns=200)
    line = next(line for line in out.splitlines() if "--tag" in line)
    assert "KEY=VALUE" in line and "<list[str]>" not in out, line


def test_kit_skip_reason_for_a_backend_with_ttl_says_why_the_test_does_not_apply() -> None:
    store = MemoryCheckpointStore()
    assert store.capabilities.ttl
    test = CheckpointStoreTests.test_ttl_without_the_capability_raises_invalid_query
    with pytest.raises(pytest.skip.Exception) as skipped:
        asyncio.run(test(CheckpointStoreTests(), store))
    reason = str(skipped.value)
    # "memory declares capabilities.ttl" read as a contradiction of the skip
    assert "without" in reason and "capabilities.ttl" in reason, reason
