"""The command line in real subprocesses: packaging, and every command on in-memory
stores. Memory does not outlive a process, so the data comes from the ``seeded``
and ``seeded-bad`` backends (see ``cli_helpers``), registered in code the way a
plugin is: an in-memory store that fills itself on open, the same in every process.

The file and SQLite backends are in ``test_cli_stores.py``; argument handling and
error formatting, which need no subprocess, in ``test_cli_usage.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cli_helpers import SEEDED, run_cli
from statekeeper.cli.entry import MISSING_EXTRA_MESSAGE

# -- packaging ------------------------------------------------------------------------


def test_import_statekeeper_never_imports_typer_or_rich(tmp_path: Path) -> None:
    code = (
        "import sys, statekeeper, statekeeper.sync, statekeeper.cli.entry\n"
        "import statekeeper.backends.memory, statekeeper.cli.demo\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'click')))"
    )
    result = run_cli(entry=[sys.executable, "-c", code], cwd=tmp_path)
    assert result.out.strip() == "[]"


def test_missing_cli_extra_prints_one_friendly_line(tmp_path: Path) -> None:
    # None in sys.modules makes the import fail, as it does without the extra.
    code = (
        "import sys; sys.modules['typer'] = None; sys.modules['rich'] = None\n"
        "from statekeeper.cli.entry import main; main()"
    )
    result = run_cli("demo", entry=[sys.executable, "-c", code], cwd=tmp_path, expect=2)
    assert result.err == MISSING_EXTRA_MESSAGE + "\n"
    assert result.out == ""


def test_console_script_is_installed_and_lists_every_command(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "statekeeper"
    assert script.exists(), "the statekeeper console script is not installed in this environment"
    result = run_cli("--help", entry=[str(script)], cwd=tmp_path)
    commands = ("demo", "info", "streams", "ls", "show", "latest", "verify", "repair", "copy")
    for command in (*commands, "prune"):
        assert f"  {command} " in result.out
    assert "  purge " in result.out


# -- every command on memory ------------------------------------------------------------


def seeded(*args: str, cwd: Path, expect: int = 0) -> Any:
    return run_cli(*args, "--json", entry=SEEDED, cwd=cwd, expect=expect).json()


def test_every_command_on_a_memory_store(tmp_path: Path) -> None:
    url = ("--url", "seeded://")
    info = seeded("info", *url, cwd=tmp_path)
    assert info["backend"] == "memory" and info["url"] == "memory://"
    assert (info["checkpoints"], info["streams"], info["high_water_mark"]) == (8, 3, 8)
    assert info["store_id"] == "seeded" and info["capabilities"]["cross_process"] is False
    assert set(info) == {
        "backend",
        "url",
        "store_id",
        "format_version",
        "checkpoints",
        "streams",
        "high_water_mark",
        "capabilities",
        "encryption",
        "extra",
    }
    assert info["encryption"] == {"enabled": False, "active_key": None, "encrypt_metadata": False}

    # streams: paged by name, with a count cap that says when it is a lower bound
    first = seeded("streams", "--limit", "2", "--count-limit", "3", *url, cwd=tmp_path)
    assert [r["name"] for r in first["streams"]] == ["odd name/with:colon", "orders"]
    assert first["streams"][1] == {
        "name": "orders",
        "checkpoints": 3,
        "checkpoints_exact": False,
        "unreadable": 0,
        "latest_sequence": 7,
        "latest_created_at": first["streams"][1]["latest_created_at"],
        "latest_readable": True,
    }
    assert first["next_after_name"] == "orders"
    rest = seeded("streams", "--after-name", "orders", *url, cwd=tmp_path)
    assert rest["streams"][0]["name"] == "users" and rest["streams"][0]["checkpoints"] == 2
    assert rest["next_after_name"] is None

    # ls: a cursor from one process pages on in the next; global options before the command
    page1 = seeded(*url, "ls", "orders", "--limit", "2", cwd=tmp_path)
    assert [i["id"] for i in page1["items"]] == ["orders-5", "orders-4"]
    assert page1["has_more"] is True and page1["prev_cursor"] is None
    assert page1["items"][0]["parent_id"] == "orders-4"
    assert page1["items"][0]["tags"] == {"kind": "final"}
    assert page1["items"][0]["metadata"] == {"n": 5, "note": "plain JSON"}
    page2 = seeded(
        "ls", "orders", "--limit", "2", "--after", page1["next_cursor"], *url, cwd=tmp_path
    )
    assert [i["sequence"] for i in page2["items"]] == [4, 2]
    tagged = seeded(
        "ls", "--order", "asc", "--tag", "kind=step", "--with-state", *url, cwd=tmp_path
    )
    assert [i["id"] for i in tagged["items"]] == [
        "orders-1",
        "orders-2",
        "orders-3",
        "orders-4",
        "odd-1",
    ]
    assert tagged["items"][-1]["state"] == {"ok": True}

    # show and latest: header and state; non-JSON values in the codec's tagged form
    latest = seeded("latest", "orders", *url, cwd=tmp_path)
    assert latest["stream"] == "orders" and latest["checkpoint"]["id"] == "orders-5"
    assert latest["checkpoint"]["state"] == {
        "step": 5,
        "items": [0, 1, 2, 3, 4],
        "at": {"$sk": "datetime", "v": "2024-01-05T00:00:00+00:00"},
    }
    shown = seeded("show", "users-2", *url, cwd=tmp_path)["checkpoint"]
    assert (shown["stream"], shown["sequence"], shown["state"]) == ("users", 3, {"name": "user2"})

    report = seeded("verify", *url, cwd=tmp_path)
    assert report == {
        "url": "memory://",
        "records": 8,
        "streams": 3,
        "high_water_mark": 8,
        "complete": True,
        "problems": [],
        "ok": True,
    }
    human = run_cli("verify", *url, entry=SEEDED, cwd=tmp_path)
    assert "checked 8 checkpoints in 3 streams, and every index and table against them: ok" in (
        human.out
    )
    repaired = seeded("repair", *url, cwd=tmp_path)
    assert (repaired["ok"], repaired["records"], repaired["damaged"]) == (True, 8, [])
    assert seeded("prune", "orders", "--keep-last", "2", *url, cwd=tmp_path) == {
        "url": "memory://",
        "stream": "orders",
        "keep_last": 2,
        "removed": 3,
    }
    assert seeded("purge", *url, cwd=tmp_path) == {"url": "memory://", "removed": 0}
    # memory -> memory copies into a store that ends with the process; it still works
    copied = seeded("copy", "seeded://", "memory://", cwd=tmp_path)
    assert (copied["seen"], copied["copied"], copied["problems"]) == (8, 8, [])
    # the demo needs a second process to see the store: a usage error, explained
    refused = run_cli("demo", *url, entry=SEEDED, cwd=tmp_path, expect=2)
    assert "cannot be shared between processes" in refused.err


def test_damaged_records_are_reported_and_never_papered_over(tmp_path: Path) -> None:
    url = ("--url", "seeded-bad://")  # orders-5 (newest of orders) torn, users-2 undecodable
    err = seeded("latest", "orders", *url, cwd=tmp_path, expect=1)["error"]
    assert err["type"] == "CheckpointDecodeError" and err["exit_code"] == 1
    assert err["id"] == "orders-5" and err["location"] == "memory:seq=7"
    assert "torn or truncated" in err["message"]
    assert "orders-4" not in str(err)  # no fallback to the older checkpoint

    human = run_cli("latest", "orders", *url, entry=SEEDED, cwd=tmp_path, expect=1)
    assert human.out == "" and human.err.count("\n") == 1
    assert human.err.startswith("error: checkpoint 'orders-5' at memory:seq=7 cannot be decoded")

    report = run_cli("verify", *url, entry=SEEDED, cwd=tmp_path, expect=1)
    assert "verifying" in report.err and "8/8" in report.err  # the progress bar
    assert "checked 8 checkpoints in 3 streams: 2 problems" in report.out
    assert "torn or truncated" in report.out and "os:system" in report.out
    assert "ok" not in report.out.split() and "readable" not in report.out
    problems = seeded("verify", *url, cwd=tmp_path, expect=1)["problems"]
    assert {(p["kind"], p["id"], p["sequence"]) for p in problems} == {
        ("damaged-record", "orders-5", 7),
        ("damaged-record", "users-2", 3),
    }

    listing = seeded("ls", *url, cwd=tmp_path, expect=1)
    assert {s["id"] for s in listing["skipped"]} == {"orders-5", "users-2"}
    assert len(listing["items"]) == 6
    by_name = seeded("streams", *url, cwd=tmp_path, expect=1)["streams"]
    streams = {r["name"]: r for r in by_name}
    assert streams["orders"]["latest_readable"] is False and streams["orders"]["unreadable"] == 1


def test_usage_errors_exit_2_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    plain = run_cli("info", "--url", "zzz://x", cwd=tmp_path, expect=2)
    assert plain.err.startswith("error: no statekeeper backend") and plain.err.count("\n") == 1
    debug = run_cli("--debug", "info", "--url", "zzz://x", cwd=tmp_path, expect=2)
    assert "Traceback" in debug.err and "BackendNotFound" in debug.err


def test_passwords_never_reach_the_terminal(tmp_path: Path) -> None:
    # A URL so broken that its message must quote it, and an option error; the
    # PostgreSQL connection failure is in test_cli_stores.py.
    secret = "Sup3r-Secret-pw"
    broken = run_cli(
        "info", "--url", f"no such://al:{secret}@h/x", "--json", cwd=tmp_path, expect=2
    )
    assert "no such://al:***@h/x" in broken.json()["error"]["message"]
    assert secret not in broken.out + broken.err
    url = f"memory://alice:{secret}@host?bogus=1"
    debug = run_cli("info", "--url", url, "--debug", cwd=tmp_path, expect=2)
    assert "Traceback" in debug.err and secret not in debug.out + debug.err
