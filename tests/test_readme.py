"""The README opens with the two quick-start commands, and CI runs the second one."""

from __future__ import annotations

import re
from pathlib import Path

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
