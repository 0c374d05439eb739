"""The test runs' own report (tests/plugins/statekeeper_progress.py): skips summarised by
reason instead of one line each, failures still listed in full, and a heartbeat line
while a test runs long, so a slow session never looks hung."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "plugins"

SKIPPING = """
import pytest

@pytest.mark.parametrize("n", range(7))
def test_needs_a(n):
    pytest.skip("server A is not configured; set A_URL")

@pytest.mark.parametrize("n", range(3))
def test_needs_b(n):
    pytest.skip("server B is not configured; set B_URL")

def test_broken():
    assert 1 == 2, "the one real failure"

def test_fine():
    pass
"""


@pytest.fixture
def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., pytest.RunResult]:
    """Run pytest in a child process, ``-ra`` as in pyproject.toml, with the plugin loaded."""
    pytester.makeini("[pytest]\naddopts = -ra\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])
    )
    # only the plugins a test names: a child that loads every installed one (Hypothesis,
    # LangSmith, ...) takes seconds to start
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*args: str, **env: str) -> pytest.RunResult:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return pytester.runpytest_subprocess(
            "-p", "statekeeper_progress", "-p", "no:cacheprovider", *args
        )

    return run


def test_skips_are_counted_by_reason_not_listed_one_by_one(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(test_mixed=SKIPPING)
    result = run()
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # no per-test SKIPPED line buries the failure
    assert "SKIPPED [" not in out
    result.stdout.fnmatch_lines(
        [
            "*10 skipped, by reason*",
            "*7 * server A is not configured; set A_URL",
            "*3 * server B is not configured; set B_URL",
        ]
    )
    # the failure keeps its traceback and its line in the short summary, after the skips
    result.stdout.fnmatch_lines(["*the one real failure*", "FAILED test_mixed.py::test_broken*"])
    assert out.index("skipped, by reason") < out.index("FAILED test_mixed.py::test_broken")
    result.assert_outcomes(failed=1, passed=1, skipped=10)


def test_list_skips_restores_the_per_test_lines(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(test_mixed=SKIPPING)
    result = run("--list-skips")
    # pytest's own lines: one per place a test skipped, with how many skipped there
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]7[]] test_mixed.py:*: server A*", "SKIPPED [[]3[]] test_mixed.py:*: server B*"]
    )
    assert "skipped, by reason" not in result.stdout.str()


def test_a_failure_that_replaces_a_skip_is_still_a_failure(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    # STATEKEEPER_REQUIRE_SERVICES turns a missing server into pytest.fail: the summary must
    # list it as a failure, never fold it into the skips
    pytester.makepyfile(
        test_server="""
from statekeeper.testing import service_url

def test_needs_postgres():
    service_url("postgres")
"""
    )
    result = run(STATEKEEPER_REQUIRE_SERVICES="1", STATEKEEPER_TEST_POSTGRES_URL="")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Failed: STATEKEEPER_TEST_POSTGRES_URL is not set*",
            "FAILED test_server.py::test_needs_postgres*",
        ]
    )
    assert "skipped, by reason" not in result.stdout.str()


def test_a_long_test_gets_a_heartbeat_naming_it(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    # the test under the heartbeat waits until the heartbeat has been written (the plugin
    # tells it through a file), so this holds however slow the machine is
    pytester.makepyfile(
        test_slow="""
import os, time
from pathlib import Path

def test_takes_its_time():
    mark = Path(os.environ["STATEKEEPER_TEST_HEARTBEAT_MARK"])
    for _ in range(1200):
        if mark.exists():
            return
        time.sleep(0.05)
    raise AssertionError("no heartbeat was written")
"""
    )
    mark = pytester.path / "heartbeat-written"
    result = run(
        STATEKEEPER_TEST_HEARTBEAT="0.2",
        STATEKEEPER_TEST_HEARTBEAT_MARK=str(mark),
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*still running*test_slow.py::test_takes_its_time*"])


def test_a_quick_run_prints_no_heartbeat(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(test_quick="def test_quick():\n    pass\n")
    # an interval no quick test outlasts, however loaded the machine (the default, 30 s,
    # is a time a starved child could reach; an inherited one could be shorter still)
    result = run(STATEKEEPER_TEST_HEARTBEAT="600")
    result.assert_outcomes(passed=1)
    assert "still running" not in result.stdout.str()


def test_reliability_figures_are_summed_over_xdist_workers(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    # nox -s reliability runs its tests on several pytest-xdist workers; the figures
    # docs/reliability.md quotes are counted in the workers and must reach the report
    reliability = Path(__file__).resolve().parent / "reliability"
    # only the controller reports, and it never loads tests/reliability/conftest.py:
    # the plugins come from the conftest every run loads
    pytester.makeconftest((Path(__file__).resolve().parent / "conftest.py").read_text("utf-8"))
    pytester.makepyfile(
        test_counting="""
import pytest
from reliability_support import FIGURES

@pytest.mark.parametrize("n", range(6))
def test_counts(n):
    FIGURES["kills survived"] += 10
"""
    )
    figures = pytester.path / "figures.json"
    result = run(
        "-p",
        "xdist",
        "-n",
        "2",
        STATEKEEPER_RELIABILITY_FIGURES=str(figures),
        # the conftest imports reliability_support from its own directory
        PYTHONPATH=os.pathsep.join([str(reliability), str(PLUGINS)]),
    )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*statekeeper reliability figures*", "kills survived: 60"])
    assert json.loads(figures.read_text("utf-8")) == {"kills survived": 60}


def test_xdist_workers_collect_the_same_ids_from_sets(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    # xdist refuses to run when its workers collect different test ids, and an id made
    # from a set follows the hash seed: the noxfile gives all workers one seed
    import importlib.util

    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)

    class Session:
        def log(self, message: str) -> None:
            print(message)

    monkeypatch.setenv("STATEKEEPER_TEST_WORKERS", "2")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    args, env = noxfile._pytest_workers(Session())
    pytester.makepyfile(
        test_sets="""
import pytest

@pytest.mark.parametrize(
    "value", [set("abcdefghijkl"), frozenset(["x", "y", "z", "w"])], ids=repr
)
def test_a_set(value):
    assert value
"""
    )
    result = run("-p", "xdist", *args, **env)
    result.assert_outcomes(passed=2)


def test_a_site_not_checked_in_a_browser_is_said_in_the_summary_line(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    """Without Chromium the browser checks of tests/test_site.py skip; the run's last
    line says so, not only the skips section above it (it once said "N skipped"
    and nothing more)."""
    pytester.makepyfile(
        test_site_like="""
import pytest

@pytest.mark.parametrize("n", range(4))
def test_in_a_browser(n):
    pytest.skip("no Chromium at /usr/bin/chromium, so the site was not checked in a browser")

def test_pages():
    pass
"""
    )
    result = run()
    assert result.ret == pytest.ExitCode.OK
    last = result.stdout.lines[-1]
    assert "4 skipped" in last and "4 not checked in a browser (no Chromium)" in last, last
    plain = pytester.makepyfile(test_other="def test_x():\n    pass\n")
    assert "browser" not in run(str(plain)).stdout.lines[-1]
