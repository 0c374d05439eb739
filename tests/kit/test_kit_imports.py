"""What importing ``statekeeper.testing`` costs, and what it says when the kit's
dependencies are missing.

Crash and concurrency tests start many child processes running
``statekeeper.testing.workloads``; each one used to import pytest at start (about
a second under load). The workloads and the modules they use must not need
pytest at all. The kit itself does need pytest, pytest-asyncio and Hypothesis,
and without them it must say how to install them rather than fail on a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# The modules a workload child process (and an invariant or history checker run
# outside pytest) imports.
NO_PYTEST_MODULES = [
    "statekeeper.testing",
    "statekeeper.testing.workloads",
    "statekeeper.testing.invariants",
    "statekeeper.testing.history",
    "statekeeper.testing.recording",
    "statekeeper.testing.services",
]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_workload_modules_do_not_import_pytest_or_hypothesis() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in NO_PYTEST_MODULES)
        + "print(sorted(m for m in ('pytest', '_pytest', 'hypothesis', 'pytest_asyncio')"
        " if m in sys.modules))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_service_url_still_skips_without_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from statekeeper.testing import service_url

    monkeypatch.delenv("STATEKEEPER_TEST_REDIS_URL", raising=False)
    monkeypatch.delenv("STATEKEEPER_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="STATEKEEPER_TEST_REDIS_URL is not set"):
        service_url("redis")


@pytest.mark.parametrize("missing", ["pytest_asyncio", "hypothesis"])
@pytest.mark.parametrize(
    "statement",
    [
        "from statekeeper.testing import CheckpointStoreTests",
        "import statekeeper.testing.kit",
    ],
)
def test_the_kit_without_its_dependencies_prints_the_install_hint(
    missing: str, statement: str
) -> None:
    # A None entry in sys.modules makes "import name" raise ModuleNotFoundError,
    # exactly as when the package is not installed.
    result = run_python(f"import sys\nsys.modules[{missing!r}] = None\n{statement}\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:"), result.stderr
    assert missing in last
    assert "pip install 'statekeeper[testing]'" in last
    assert "uv sync --extra testing" in last
