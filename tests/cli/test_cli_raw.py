"""The command line on stores whose states are raw bytes (codec="raw")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import statekeeper as sk
from cli_helpers import run_cli


def _seed(url: str) -> None:
    async def main() -> None:
        async with sk.open_store(url, codec="raw") as store:
            await store.save("blobs", b"\x00\xff" * 40)

    asyncio.run(main())


def test_latest_and_ls_summarise_raw_state_by_length_and_hex(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/raw.db"
    _seed(url)
    latest = run_cli("latest", "blobs", "--url", url, "--json", cwd=tmp_path).json()
    assert latest["checkpoint"]["state"] == {
        "raw_bytes": 80,
        "hex": "00ff" * 16,
        "truncated": True,
    }
    page = run_cli("ls", "blobs", "--url", url, "--json", "--with-state", cwd=tmp_path)
    assert '"raw_bytes": 80' in page.out
    human = run_cli("latest", "blobs", "--url", url, cwd=tmp_path)
    assert "raw_bytes" in human.out
    assert "AP8A" not in human.out  # never the bytes as base64
