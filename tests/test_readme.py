"""The README opens with the two quick-start commands, and CI runs the second one; what
it says about installing, server tests and URLs is true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text("utf-8")
    first_block = re.search(r"```console\n(.*?)```", text, re.DOTALL)
    assert first_block is not None, "README must open with a console block"
    assert text.index("```console") < text.index("## "), "the commands come before any section"
    return [line for line in first_block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_one_line_commands() -> None:
    commands = _opening_commands()
    assert len(commands) == 2
    demo, tests = commands
    assert demo.startswith("python3 -m pip install") and demo.endswith("statekeeper demo")
    assert tests.startswith("python3 -m pip install")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text("utf-8").splitlines()
    assert ci[-1] == _opening_commands()[1]


def test_ci_runs_the_readme_demo_command_from_a_fresh_copy() -> None:
    quickstart = (ROOT / ".ci" / "quickstart").read_text("utf-8")
    assert "git clone" in quickstart and "python3 -m venv" in quickstart
    assert "bash .ci/quickstart" in (ROOT / ".ci" / "run").read_text("utf-8")


def test_readme_shows_the_server_test_exports_that_ci_uses() -> None:
    from statekeeper.testing.services import SERVICE_ENV

    def exports(text: str) -> list[str]:
        return sorted(
            line.strip()
            for line in text.splitlines()
            if line.strip().startswith("export STATEKEEPER_TEST_")
        )

    readme = exports((ROOT / "README.md").read_text("utf-8"))
    assert readme == exports((ROOT / ".ci" / "run").read_text("utf-8"))
    assert sorted(line.split("=")[0].removeprefix("export ") for line in readme) == sorted(
        SERVICE_ENV.values()
    )


def test_readme_lists_every_extra_and_how_to_install_from_a_checkout() -> None:
    import tomllib

    text = (ROOT / "README.md").read_text("utf-8")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    for extra in pyproject["project"]["optional-dependencies"]:
        assert f"| `{extra}` |" in text, f"README's install table lacks the extra {extra!r}"
    assert "uv sync --all-extras" in text
    assert "pip install -e '.[cli,postgres,mysql,testing]'" in text


def test_readme_slash_rules_for_sqlite_and_file_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statekeeper as sk

    monkeypatch.chdir(tmp_path)
    text = " ".join((ROOT / "README.md").read_text("utf-8").split())
    assert "`sqlite:///x/y.db` is `x/y.db` relative to the working directory" in text
    assert "`sqlite:////x/y.db`" in text and "`file:///x/y` is the absolute directory" in text
    assert sk.open_store("sqlite:///x/y.db").describe() == f"sqlite:///{tmp_path}/x/y.db"
    assert sk.open_store("sqlite:////x/y.db").describe() == "sqlite:////x/y.db"
    assert sk.open_store("file:///x/y").describe() == "file:///x/y"
    assert sk.open_store("file:x/y").describe() == f"file://{tmp_path}/x/y"


def test_contributing_is_linked_and_lists_every_nox_session() -> None:
    contributing = (ROOT / "CONTRIBUTING.md").read_text("utf-8")
    assert "](CONTRIBUTING.md)" in (ROOT / "README.md").read_text("utf-8")
    assert "](../CONTRIBUTING.md)" in (ROOT / "docs" / "backend-authors.md").read_text("utf-8")
    noxfile = (ROOT / "noxfile.py").read_text("utf-8")
    sessions = re.findall(r"@nox\.session\([^)]*\)\ndef (\w+)\(", noxfile)
    assert sessions, "no sessions found in noxfile.py"
    for name in sessions:
        assert f"| `{name}` |" in contributing, f"CONTRIBUTING.md does not describe nox -s {name}"


def test_readme_serves_the_docs_without_the_material_banner() -> None:
    # Material for MkDocs prints a large end-of-life banner on every mkdocs command
    # unless NO_MKDOCS_2_WARNING=1; nox -s docs sets it, and so must the README's
    # command for serving the site
    noxfile = (ROOT / "noxfile.py").read_text("utf-8")
    assert '"NO_MKDOCS_2_WARNING": "1"' in noxfile
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    serve = re.findall(r"`([^`]*mkdocs serve[^`]*)`", readme)
    assert serve, "README says how to serve the docs"
    for command in serve:
        assert command.startswith("NO_MKDOCS_2_WARNING=1 uv run "), command


def test_readme_says_what_the_test_command_prints_and_how_to_tune_it() -> None:
    # the knobs and lines the README promises are the ones the noxfile and the run's
    # report plugin have (tests/test_run_report.py checks what the plugin prints)
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    noxfile = (ROOT / "noxfile.py").read_text("utf-8")
    plugin = (ROOT / "tests" / "plugins" / "statekeeper_progress.py").read_text("utf-8")
    assert "STATEKEEPER_TEST_WORKERS" in readme and '"STATEKEEPER_TEST_WORKERS"' in noxfile
    assert "--list-skips" in readme and '"--list-skips"' in plugin
    assert "... still running after" in readme and "... still running after" in plugin
    assert re.search(r"takes about \d+ minutes on a 2-core machine", readme)


def test_readme_keeps_no_hand_counted_test_figures() -> None:
    # "about 500 of the 2,300 tests" went stale (a count gave 4,319 and about 885): a
    # figure nobody regenerates is dropped; the run itself counts its skips by reason
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    counted = re.findall(r"\b\d[\d,]*\s+(?:of the\s+[\d,]+\s+)?tests\b", readme)
    assert counted == [], counted
    plugin = (ROOT / "tests" / "plugins" / "statekeeper_progress.py").read_text("utf-8")
    assert "not checked in a browser (no Chromium)" in readme
    assert '"not checked in a browser (no Chromium)"' in plugin
