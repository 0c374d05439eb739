"""Argument handling and error formatting of the command line, in process (typer's
runner) since none of it needs a second process; the real-subprocess tests are in
``test_cli.py`` and ``test_cli_stores.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_helpers import register_seeded
from statekeeper.cli.commands import app
from statekeeper.cli.hints import program
from statekeeper.cli.output import DEFAULT_URL, Output

runner = CliRunner()
# seeded:// is an in-memory store that exists (and fills itself) when opened;
# a bare memory:// names no existing store, so read-only commands refuse it.
register_seeded()


def invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"STATEKEEPER_URL": None, **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frobnicate"], "No such command"),
        (["ls", "--limit", "0"], "--limit"),
        (["ls", "--limit", "1001"], "--limit"),
        (["ls", "--tag", "novalue"], "expected KEY=VALUE"),
        (["ls", "--order", "sideways"], "--order"),
        (["prune", "s"], "--keep-last"),
        (["prune", "s", "--keep-last", "-1"], "--keep-last"),
        (["demo", "--steps", "4", "--kill-after", "4"], "--kill-after"),
        (["demo", "--steps", "1"], "--steps"),
        (["info", "--url", "not a url"], "is not a store URL"),
        (["info", "--url", "zzz://x"], "no statekeeper backend is installed for scheme 'zzz'"),
        (["info", "--url", "memory://?bogus=1"], "bogus"),
        (["ls", "--url", "seeded://", "--after", "forged-cursor"], "cursor"),
        (["ls", "--url", "seeded://", "--after", "a", "--before", "b"], "at most one"),
        (["ls", "", "--url", "seeded://"], "stream must be a non-empty string"),
        (["copy", "memory://", "zzz://x"], "scheme 'zzz'"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    code, out, err = invoke(*args)
    assert code == 2
    assert message in err
    assert "Traceback" not in out + err


def test_an_error_is_one_red_line_and_a_json_document_with_json() -> None:
    code, out, err = invoke("show", "nope", "--url", "seeded://")
    assert code == 1 and out == ""
    assert err == "error: no live checkpoint with id 'nope'\n"
    code, out, err = invoke("show", "nope", "--url", "seeded://", "--json")
    assert code == 1
    assert json.loads(out) == {
        "error": {
            "type": "CheckpointNotFound",
            "message": "no live checkpoint with id 'nope'",
            "exit_code": 1,
        }
    }


def test_url_comes_from_flag_then_environment_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"STATEKEEPER_URL": "zzz://from-env"}
    code, _, err = invoke("info", env=env)
    assert code == 2 and "'zzz'" in err
    code, out, _ = invoke("info", "--json", "--url", "seeded://", env=env)
    assert code == 0 and json.loads(out)["backend"] == "memory"
    code, out, _ = invoke("--url", "seeded://", "info", "--json", env=env)
    assert code == 0 and json.loads(out)["backend"] == "memory"
    monkeypatch.delenv("STATEKEEPER_URL", raising=False)
    assert Output().resolve_url(None) == DEFAULT_URL
    monkeypatch.setenv("STATEKEEPER_URL", "memory://")
    assert Output().resolve_url(None) == "memory://"
    assert Output().resolve_url("file:x") == "file:x"


def test_scrub_hides_passwords_that_a_driver_put_in_its_message() -> None:
    out = Output()
    out.remember("postgresql+asyncpg://alice:p%40ss%2Fw0rd@db:5432/app")
    message = (
        "connection to 'postgresql://alice:p@ss/w0rd@db:5432/app' failed; "
        "password p@ss/w0rd rejected (dsn=host=db password=p%40ss%2Fw0rd)"
    )
    scrubbed = out.scrub(message)
    assert "p@ss/w0rd" not in scrubbed and "p%40ss%2Fw0rd" not in scrubbed
    assert out.scrub("mysql://root:hunter22@h/db") == "mysql://root:***@h/db"
    assert out.safe_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


# -- --json: one document, whatever went wrong ------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ls", "--limit", "abc"], "Invalid value for '--limit'"),
        (["ls", "--limit", "0"], "greater than or equal to 1"),
        (["ls", "--tag", "nokv", "--url", "seeded://"], "expected KEY=VALUE, got 'nokv'"),
        (["ls", "--order", "up"], "Invalid value for '--order': 'up' is not one of"),
        (["--json", "ls", "--order", "up"], "is not one of 'asc', 'desc'"),
        (["ls", "--frobnicate"], "No such option"),
        (["prune", "s"], "Missing option '--keep-last'"),
        (["frobnicate"], "No such command"),
        (["--json"], "Missing command"),
    ],
)
def test_a_usage_error_with_json_is_one_json_document(args: list[str], message: str) -> None:
    code, out, err = invoke(*args, *([] if "--json" in args else ["--json"]))
    assert code == 2
    doc = json.loads(out)  # exactly one document: json.loads refuses trailing data
    assert set(doc) == {"error"} and doc["error"]["exit_code"] == 2
    assert message in doc["error"]["message"]
    assert message in err  # still explained on stderr, as without --json
    assert "Value error" not in out + err  # pydantic's wording stays inside typer


def test_a_usage_error_without_json_prints_nothing_on_stdout() -> None:
    code, out, err = invoke("ls", "--order", "up")
    assert code == 2 and out == ""
    assert "Value error" not in err and "'up' is not one of 'asc', 'desc'" in err


# -- docs/cli.md says what the command line prints -------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_every_usage_line_in_the_docs_is_what_help_prints() -> None:
    text = DOCS.read_text()
    documented = dict(re.findall(r"^Usage: statekeeper (\w+) (.*)$", text, re.MULTILINE))
    # the commands with arguments each show their usage line once
    assert {"ls", "prune", "latest", "show", "copy"} <= set(documented)
    for name, usage in documented.items():
        code, out, _ = invoke(name, "--help")
        assert code == 0
        assert f"Usage: statekeeper {name} {usage}" in out.splitlines()
    assert documented["ls"] == "[OPTIONS] [STREAM]"  # optional
    assert documented["prune"] == "[OPTIONS] {STREAM}"  # required, typer's braces


def test_the_exit_status_table_names_every_command_that_can_exit_1() -> None:
    table = DOCS.read_text().split("## Exit statuses", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| 1 |"))
    for name in ("verify", "repair", "latest", "show", "ls", "streams", "copy"):
        assert f"`{name}`" in row, name
    assert "StoreNotFound" in table


# -- hints: the program, as the user's shell can reach it ------------------------------


def _venv(root: Path, *, uv_project: bool) -> tuple[Path, Path]:
    """A fake project with a .venv holding a statekeeper script; (venv, python)."""
    venv = root / "proj" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "statekeeper").write_text("#!/bin/sh\n")
    (venv / "bin" / "statekeeper").chmod(0o755)
    (root / "proj" / "pyproject.toml").write_text("[project]\nname='x'\n")
    if uv_project:
        (root / "proj" / "uv.lock").write_text("")
    return venv, venv / "bin" / "python"


def test_hint_program_under_uv_run_is_uv_run(tmp_path: Path) -> None:
    venv, python = _venv(tmp_path, uv_project=True)
    env = {"UV": "/usr/bin/uv", "VIRTUAL_ENV": str(venv), "PATH": str(venv / "bin")}
    inside = program(env, str(venv), str(python), cwd=venv.parent)
    assert inside == ["uv", "run", "--frozen", "--no-dev", "--extra", "cli", "statekeeper"]
    outside = program(env, str(venv), str(python), cwd=tmp_path)
    assert outside[:4] == ["uv", "run", "--project", str(venv.parent)]
    assert outside[4:] == inside[2:]


def test_hint_program_without_uv(tmp_path: Path) -> None:
    venv, python = _venv(tmp_path, uv_project=False)
    script = str(venv / "bin" / "statekeeper")
    # on PATH (an activated venv): the bare name
    assert program({"PATH": str(venv / "bin")}, str(venv), str(python), tmp_path) == ["statekeeper"]
    # not on PATH: the script's absolute path
    assert program({"PATH": "/nowhere"}, str(venv), str(python), tmp_path) == [script]
    # a uv project's .venv, not on PATH and not under uv run: uv run
    uv_venv, uv_python = _venv(tmp_path / "u", uv_project=True)
    got = program({"PATH": "/nowhere"}, str(uv_venv), str(uv_python), cwd=uv_venv.parent)
    assert got[:2] == ["uv", "run"]
    # no console script at all: python -m
    (venv / "bin" / "statekeeper").unlink()
    assert program({"PATH": "/nowhere"}, str(venv), str(python), tmp_path) == [
        str(python),
        "-m",
        "statekeeper.cli",
    ]
