"""Argument handling and error formatting of the command line, in process (typer's
runner) since none of it needs a second process; the real-subprocess tests are in
``test_cli.py`` and ``test_cli_stores.py``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from statekeeper.cli.commands import app
from statekeeper.cli.output import DEFAULT_URL, Output

runner = CliRunner()


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
        (["ls", "--url", "memory://", "--after", "forged-cursor"], "cursor"),
        (["ls", "--url", "memory://", "--after", "a", "--before", "b"], "at most one"),
        (["ls", "", "--url", "memory://"], "stream must be a non-empty string"),
        (["copy", "memory://", "zzz://x"], "scheme 'zzz'"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    code, out, err = invoke(*args)
    assert code == 2
    assert message in err
    assert "Traceback" not in out + err


def test_an_error_is_one_red_line_and_a_json_document_with_json() -> None:
    code, out, err = invoke("show", "nope", "--url", "memory://")
    assert code == 1 and out == ""
    assert err == "error: no live checkpoint with id 'nope'\n"
    code, out, err = invoke("show", "nope", "--url", "memory://", "--json")
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
    code, out, _ = invoke("info", "--json", "--url", "memory://", env=env)
    assert code == 0 and json.loads(out)["backend"] == "memory"
    code, out, _ = invoke("--url", "memory://", "info", "--json", env=env)
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
