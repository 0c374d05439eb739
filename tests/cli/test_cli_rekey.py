"""``statekeeper rekey`` (SPEC §4, S16): a plaintext store encrypted in place, a key
rotated, a run killed with SIGKILL and run again, and its errors.

Every check reads the store afterwards: through the API with the keys (the full
listing must be what it was: ids, sequences, etags, timestamps, expiry, order,
states), through the raw records (which key each one is sealed under), and as the
bytes on disk (no state marker left in any file, SQLite's WAL included).
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import statekeeper
from cli_helpers import ENTRY, cli_env, run_cli
from statekeeper import Checkpoint
from statekeeper.cli.commands import app
from statekeeper.encryption import Keyring
from statekeeper.models import NewCheckpoint

#: Fixed test keys (never real ones).
K0 = bytes(range(32))
K1 = bytes(range(100, 132))
MARKER = "REKEY-MARKER-PLAINTEXT"
ENVELOPE = b"SKE1"  # the envelope's magic (statekeeper.encryption.envelope)

runner = CliRunner()


def spec(kid: str, key: bytes) -> str:
    return f"{kid}:{base64.b64encode(key).decode()}"


def ring(*kids: str) -> Keyring:
    keys = {"k0": K0, "k1": K1}
    return Keyring({k: keys[k] for k in kids}, active=kids[0])


def keys_env(*kids: str) -> dict[str, str]:
    keys = {"k0": K0, "k1": K1}
    return {"STATEKEEPER_KEYS": ",".join(spec(k, keys[k]) for k in kids)}


def url_of(tmp_path: Path, kind: str, fast: bool = False) -> str:
    query = "?durability=fast" if fast else ""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}{query}"
    return f"file://{tmp_path / 'store'}{query}"


def items(n: int, offset: int = 0) -> list[NewCheckpoint]:
    return [
        NewCheckpoint(
            stream=f"s{i % 3}",
            state={"i": i, "secret": f"{MARKER}-{i}"},
            tags={"kind": "even" if i % 2 == 0 else "odd"},
            metadata={"n": i},
            ttl=3600 if i % 4 == 0 else None,
        )
        for i in range(offset, offset + n)
    ]


async def seed(url: str, batch: list[NewCheckpoint], keyring: Keyring | None) -> list[Checkpoint]:
    made: list[Checkpoint] = []
    async with statekeeper.open_store(url, encryption=keyring) as store:
        for start in range(0, len(batch), 500):
            made += await store.save_many(batch[start : start + 500])
    return made


def fields(cp: Checkpoint) -> tuple[Any, ...]:
    return (
        cp.id,
        cp.stream,
        cp.sequence,
        cp.etag,
        cp.created_at,
        cp.updated_at,
        cp.expires_at,
        cp.parent_id,
        dict(cp.tags),
        dict(cp.metadata),
        cp.state,
    )


async def listing(url: str, keyring: Keyring | None) -> tuple[list[tuple[Any, ...]], int]:
    """Every live checkpoint in global order, and how many records were skipped."""
    found: list[tuple[Any, ...]] = []
    skipped = 0
    async with statekeeper.open_store(url, encryption=keyring, read_only=True) as store:
        cursor = None
        while True:
            page = await store.list(None, order="asc", limit=1000, after=cursor)
            found += [fields(cp) for cp in page.items]
            skipped += len(page.skipped)
            cursor = page.next_cursor
            if cursor is None:
                return found, skipped


def key_id(raw: bytes) -> str | None:
    """The key id an encrypted record names in its envelope; ``None``: plaintext."""
    at = raw.find(ENVELOPE)
    if at < 0:
        return None
    length = raw[at + 6]
    return raw[at + 7 : at + 7 + length].decode()


async def key_ids(url: str, ids: list[str]) -> dict[str, str | None]:
    """Which key each record is sealed under, read from its raw bytes (no keys)."""
    async with statekeeper.open_store(url, read_only=True) as store:
        return {rid: key_id(await store.backdoor_read_raw(rid)) for rid in ids}


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def signal_once_under_way(
    proc: subprocess.Popen[Any], url: str, first: str, sig: int
) -> bool:
    """Send ``sig`` to the ``rekey`` in ``proc`` once record ``first`` (the lowest
    sequence: rekey goes in sequence order) is under the new key, so the run is part
    way; ``False`` if it finished first. One reader polls (no store opened per poll,
    so a loaded machine still catches the run under way)."""
    async with statekeeper.open_store(url, read_only=True) as store:
        while proc.poll() is None:
            if key_id(await store.backdoor_read_raw(first)) == "k1":
                proc.send_signal(sig)
                return True
            await asyncio.sleep(0.001)  # a poll interval, not a deadline
    return False


def files_with_marker(tmp_path: Path) -> list[Path]:
    """The files under ``tmp_path`` (the database, its WAL, the store's files) in
    which the state marker can be read."""
    return [p for p in tmp_path.rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    full = {"STATEKEEPER_URL": None, "STATEKEEPER_KEYS": None, "COLUMNS": "200", **(env or {})}
    result = runner.invoke(app, list(args), env=full)
    return result.exit_code, result.stdout, result.stderr


REKEY_KEYS = {
    "url",
    "active_key",
    "examined",
    "rekeyed",
    "were_plaintext",
    "already_current",
    "changed_concurrently",
    "failed",
    "ok",
}


# -- a plaintext store encrypted in place ---------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_rekey_encrypts_a_plaintext_store_in_place(tmp_path: Path, kind: str) -> None:
    url = url_of(tmp_path, kind)
    made = asyncio.run(seed(url, items(40), None))
    before, _ = asyncio.run(listing(url, None))
    assert files_with_marker(tmp_path)  # the marker is there to be found

    result = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=keys_env("k1"))
    doc = result.json()
    assert set(doc) == REKEY_KEYS
    assert doc["active_key"] == "k1" and doc["ok"] is True and doc["failed"] == []
    assert (doc["examined"], doc["rekeyed"], doc["were_plaintext"]) == (40, 40, 40)
    assert (doc["already_current"], doc["changed_concurrently"]) == (0, 0)

    after, skipped = asyncio.run(listing(url, ring("k1")))
    assert after == before and skipped == 0  # ids, sequences, etags, times, expiry, order
    assert [f[0] for f in after] == [cp.id for cp in made]
    assert set(asyncio.run(key_ids(url, [cp.id for cp in made])).values()) == {"k1"}
    assert files_with_marker(tmp_path) == []  # nor in the WAL, a journal or an old file
    # the same store without the keys reads none of it
    _, plain_skipped = asyncio.run(listing(url, None))
    assert plain_skipped == 40

    code, out, _ = invoke("verify", "--url", url, "--json", env=keys_env("k1"))
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["problems"] == [], report

    again = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=keys_env("k1")).json()
    assert (again["examined"], again["rekeyed"], again["already_current"]) == (40, 0, 40)


def test_rekey_prints_a_summary_and_a_progress_bar(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")
    asyncio.run(seed(url, items(5), None))
    result = run_cli("rekey", "--url", url, cwd=tmp_path, env=keys_env("k1"))
    assert "rekeying" in result.err and "5/5" in result.err  # the bar, on stderr
    assert (
        "examined 5 records: rekeyed 5 under key 'k1' (5 of them were plaintext), already "
        "current 0, changed concurrently 0, failed 0; every record is under the active key"
    ) in " ".join(result.out.split())


# -- rotation ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_rotation_moves_every_record_to_the_new_key(tmp_path: Path, kind: str) -> None:
    url = url_of(tmp_path, kind)
    made = asyncio.run(seed(url, items(12), ring("k0")))
    before, _ = asyncio.run(listing(url, ring("k0")))
    both = keys_env("k1", "k0")

    # before the rekey: readable, and every record a retired-key notice; exit 0
    code, out, _ = invoke("verify", "--url", url, "--json", env=both)
    report = json.loads(out)
    assert code == 0 and report["ok"] is True
    assert [p["kind"] for p in report["problems"]] == ["retired-key"] * 12
    assert {p["id"] for p in report["problems"]} == {cp.id for cp in made}
    code, out, _ = invoke("verify", "--url", url, env=both)
    text = " ".join(out.split())
    assert code == 0 and ": ok" in text and "under a retired key" in text
    assert "12 records still under a retired key" in text and "statekeeper rekey" in text
    assert "and 7 more notices" in text  # the table shows a few, the verdict counts all

    doc = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=both).json()
    assert (doc["rekeyed"], doc["were_plaintext"], doc["already_current"]) == (12, 0, 0)
    assert set(asyncio.run(key_ids(url, [cp.id for cp in made])).values()) == {"k1"}

    # the old key can go: with k1 alone every record reads, and nothing is noticed
    after, skipped = asyncio.run(listing(url, ring("k1")))
    assert after == before and skipped == 0
    code, out, _ = invoke("ls", "--url", url, "--json", "--limit", "100", env=keys_env("k1"))
    page = json.loads(out)
    assert code == 0 and len(page["items"]) == 12 and page["skipped"] == []
    code, out, _ = invoke("verify", "--url", url, "--json", env=keys_env("k1"))
    assert code == 0 and json.loads(out)["problems"] == []


def test_records_under_a_key_not_given_fail_and_are_listed(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")
    made = asyncio.run(seed(url, items(3), ring("k0")))
    code, out, _ = invoke("rekey", "--url", url, "--json", env=keys_env("k1"))
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["rekeyed"] == 0
    assert [f["id"] for f in doc["failed"]] == [cp.id for cp in made]
    assert all(f["location"] and "k0" in f["reason"] for f in doc["failed"]), doc
    assert {f["error"] for f in doc["failed"]} == {"RecordUndecryptable"}
    # left as they were: k0 still reads them
    assert asyncio.run(listing(url, ring("k0")))[1] == 0

    code, out, _ = invoke("rekey", "--url", url, env=keys_env("k1"))
    text = " ".join(out.split())
    assert code == 1 and "not rekeyed (left as they were)" in text and made[0].id in text
    assert "cannot be decrypted" in text and "failed 3" in text
    assert "add that key after the active one" in text


# -- resumable after SIGKILL ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_rekey_killed_with_sigkill_resumes_and_loses_nothing(tmp_path: Path, kind: str) -> None:
    # a run that finishes before the test sees it under way proves nothing: the
    # store is made again, twice as large, until one is killed part way
    for n in (2000, 6000, 18000):
        root = tmp_path / f"n{n}"
        root.mkdir()
        url = url_of(root, kind, fast=True)
        # older records under the old key, newer ones in plaintext: rekey moves both
        made = asyncio.run(seed(url, items(n), ring("k0")))
        made += asyncio.run(seed(url, items(n, offset=n), None))
        ids = [cp.id for cp in made]
        proc = subprocess.Popen(
            [*ENTRY, "rekey", "--url", url, "--json"],
            cwd=root,
            env=cli_env(keys_env("k1", "k0")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            killed = asyncio.run(signal_once_under_way(proc, url, ids[0], signal.SIGKILL))
        finally:
            proc.wait(timeout=300)
        if killed:
            break
    assert proc.returncode == -signal.SIGKILL, "rekey finished before it could be killed"
    tmp_path = root
    expected = [fields(cp) for cp in made]

    halfway = asyncio.run(key_ids(url, ids))
    done = sum(1 for kid in halfway.values() if kid == "k1")
    assert 0 < done < len(ids), done  # killed part way through
    assert set(halfway.values()) <= {"k1", "k0", None}

    doc = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=keys_env("k1", "k0")).json()
    assert doc["ok"] is True and doc["failed"] == [] and doc["examined"] == len(ids)
    assert doc["already_current"] == done  # the first run's work, counted, not redone
    assert doc["rekeyed"] == len(ids) - done and doc["changed_concurrently"] == 0
    assert doc["were_plaintext"] == sum(1 for kid in halfway.values() if kid is None)

    assert set(asyncio.run(key_ids(url, ids)).values()) == {"k1"}  # no plaintext, no k0
    after, skipped = asyncio.run(listing(url, ring("k1")))
    assert skipped == 0 and after == expected  # same ids, sequences, etags, states, order
    assert files_with_marker(tmp_path) == []


# -- errors -----------------------------------------------------------------------------


def test_rekey_without_keys_is_a_usage_error_and_changes_nothing(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")
    made = asyncio.run(seed(url, items(2), None))
    code, out, err = invoke("rekey", "--url", url, "--json")
    error = json.loads(out)["error"]
    assert code == 2 and error["type"] == "KeysNotSet" and error["exit_code"] == 2
    assert "STATEKEEPER_KEYS" in error["message"] and "nothing was changed" in error["message"]
    assert "STATEKEEPER_KEYS" in err
    # an empty variable is no keys either
    code, _, err = invoke("rekey", "--url", url, env={"STATEKEEPER_KEYS": " "})
    assert code == 2 and "rekey needs the keys" in err
    assert set(asyncio.run(key_ids(url, [cp.id for cp in made])).values()) == {None}


def test_rekey_refuses_a_read_only_store(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")
    made = asyncio.run(seed(url, items(2), None))
    code, out, _ = invoke("rekey", "--url", f"{url}?read_only=true", "--json", env=keys_env("k1"))
    error = json.loads(out)["error"]
    assert code == 2 and error["type"] == "ReadOnlyStore"
    assert "read-only" in error["message"] and "drop read_only" in error["message"]
    assert set(asyncio.run(key_ids(url, [cp.id for cp in made])).values()) == {None}


def test_rekey_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")
    code, out, _ = invoke("rekey", "--url", url, "--json", env=keys_env("k1"))
    assert code == 1 and json.loads(out)["error"]["type"] == "StoreNotFound"
    assert list(tmp_path.iterdir()) == []


def test_malformed_keys_are_a_usage_error_that_quotes_no_key(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")
    asyncio.run(seed(url, items(1), None))
    secret = base64.b64encode(K1).decode()
    bad = {"STATEKEEPER_KEYS": f"k1:{secret},k1:{secret}"}
    code, out, err = invoke("rekey", "--url", url, "--json", env=bad)
    error = json.loads(out)["error"]
    assert code == 2 and error["type"] == "InvalidOptions" and "twice" in error["message"]
    assert secret not in out + err


def test_rekey_is_in_the_help(tmp_path: Path) -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    line = next(line for line in out.splitlines() if line.strip().startswith("rekey"))
    assert "active key" in line
    code, out, _ = invoke("rekey", "--help")
    assert code == 0 and "Usage: statekeeper rekey [OPTIONS]" in out
    assert "STATEKEEPER_KEYS" in out and "resumable" in out


def test_the_keys_variable_is_the_one_encryption_env_reads() -> None:
    from statekeeper.cli.output import KEYS_ENV
    from statekeeper.encryption import ENV_VAR

    assert KEYS_ENV == ENV_VAR == "STATEKEEPER_KEYS"


def test_rekey_interrupted_with_ctrl_c_says_how_far_it_got(tmp_path: Path) -> None:
    for n in (3000, 9000, 27000):  # again larger until a run is interrupted part way
        root = tmp_path / f"n{n}"
        root.mkdir()
        url = url_of(root, "sqlite", fast=True)
        ids = [cp.id for cp in asyncio.run(seed(url, items(n), None))]
        proc = subprocess.Popen(
            [*ENTRY, "rekey", "--url", url, "--json"],
            cwd=root,
            env=cli_env(keys_env("k1")),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # as from a terminal: a pytest-xdist worker ignores SIGINT, and a child
            # inherits that, so Ctrl-C would never reach the command line
            preexec_fn=_sigint_default,
        )
        try:
            interrupted = asyncio.run(signal_once_under_way(proc, url, ids[0], signal.SIGINT))
            out, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
        if interrupted and proc.returncode == 130:
            break
    tmp_path = root
    assert proc.returncode == 130, (proc.returncode, out, err)
    error = json.loads(out)["error"]
    assert error["type"] == "KeyboardInterrupt" and error["examined"] >= 0
    assert "run the same command again to continue" in error["message"]
    assert "Traceback" not in out + err
    doc = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=keys_env("k1")).json()
    assert doc["ok"] and doc["already_current"] >= 1
    assert doc["already_current"] + doc["rekeyed"] == len(ids)
    assert set(asyncio.run(key_ids(url, ids)).values()) == {"k1"}


def test_rekey_keeps_sealed_tags_and_metadata_sealed_unless_the_url_says(tmp_path: Path) -> None:
    url = url_of(tmp_path, "sqlite")

    async def write() -> list[Checkpoint]:
        async with statekeeper.open_store(url, encryption=ring("k0"), encrypt_metadata=True) as st:
            return [
                await st.save("s", {"i": i}, tags={"who": MARKER}, metadata={"m": MARKER})
                for i in range(3)
            ]

    made = asyncio.run(write())
    # rotating a store that seals its metadata: it still does afterwards
    doc = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=keys_env("k1", "k0")).json()
    assert doc["rekeyed"] == 3 and doc["ok"]
    assert files_with_marker(tmp_path) == []
    after, _ = asyncio.run(listing(url, ring("k1")))
    assert after == [fields(cp) for cp in made]
    # and a rerun finds it current, rather than unsealing it
    doc = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=keys_env("k1")).json()
    assert (doc["rekeyed"], doc["already_current"]) == (0, 3)
    # ?encrypt_metadata=false chooses, on purpose, to keep tags and metadata in the clear
    plain_meta = f"{url}?encrypt_metadata=false"
    doc = run_cli("rekey", "--url", plain_meta, "--json", cwd=tmp_path, env=keys_env("k1")).json()
    assert doc["rekeyed"] == 3
    assert files_with_marker(tmp_path)  # the tags and metadata are readable now
    assert asyncio.run(listing(url, ring("k1")))[0] == [fields(cp) for cp in made]
