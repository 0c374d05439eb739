"""Developer sessions. ``uv run --frozen nox`` runs the default set (what CI runs).

Every session installs the locked environment (``uv.lock``) into its own virtualenv
with ``uv sync --frozen``, so nothing installed by hand leaks into a run.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "typecheck", "tests", "docs", "reliability", "redis"]

PYTHON = os.environ.get("STATEKEEPER_NOX_PYTHON", "3.11")

# tests/plugins/statekeeper_progress.py: skips counted by reason, a heartbeat line while
# a test runs long. tests/conftest.py loads it for the suites under tests/; the Redis
# plugin's tests load it through -p.
PLUGINS = str(Path(__file__).parent / "tests" / "plugins")


def _pytest_workers(session: nox.Session) -> tuple[list[str], dict[str, str]]:
    """pytest-xdist's arguments and environment: one worker per core, at most 4.

    The tests spend much of their time in child processes, servers and fsync, so
    workers on every core shorten a run; beyond 4 the shared database servers and the
    disk, not the cores, would be what they wait on. ``STATEKEEPER_TEST_WORKERS`` sets
    the number; ``0`` runs the tests in one process, in file order.

    Every worker must collect the same test ids, and ids made from sets follow the hash
    seed, so the workers share one ``PYTHONHASHSEED``: random per run as Python's own
    would be, logged so that a run can be repeated with it.
    """
    raw = os.environ.get("STATEKEEPER_TEST_WORKERS", "")
    if raw and not raw.isdigit():
        session.error(f"STATEKEEPER_TEST_WORKERS={raw!r}: give a number of workers, 0 for none")
    count = int(raw) if raw else min(4, os.cpu_count() or 1)
    if count <= 0:
        return [], {}
    seed = os.environ.get("PYTHONHASHSEED") or str(random.randrange(1, 2**32))
    session.log(f"{count} pytest-xdist workers, PYTHONHASHSEED={seed}")
    return ["-n", str(count)], {"PYTHONHASHSEED": seed}


def _sync(session: nox.Session, *extra: str) -> None:
    session.run_install(
        "uv",
        "sync",
        "--frozen",
        "--all-extras",
        "--group",
        "dev",
        # byte-compile at install: the many subprocess tests otherwise recompile every
        # import in every child (PYTHONDONTWRITEBYTECODE is common in CI images)
        "--compile-bytecode",
        *extra,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        silent=True,
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over everything."""
    _sync(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    _sync(session)
    session.run("mypy", "--strict", "src/statekeeper")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite, including the conformance kit on every built-in backend."""
    # the whole workspace: the integrations' tests run on the Redis plugin too
    _sync(session, "--all-packages")
    workers, env = _pytest_workers(session)
    session.run(
        "pytest",
        "tests",
        "-p",
        "no:cacheprovider",
        *workers,
        "-m",
        "not reliability",
        "--ignore=tests/test_docs.py",
        "--ignore=tests/test_site.py",
        *session.posargs,
        env=env,
    )


@nox.session(python=PYTHON)
def conformance_long(session: nox.Session) -> None:
    """The conformance kit with 10x the state-machine examples."""
    _sync(session)
    session.run(
        "pytest",
        "tests",
        "-k",
        "Conformance or conformance",
        "--statekeeper-examples-scale=10",
        *session.posargs,
    )


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the site strictly, check it in headless Chromium, run every docs example.

    The site goes to ``.nox/docs/site`` and the browser check's screenshots (the
    landing page, the ``get_latest`` reference) to ``.nox/docs/screenshots``.
    """
    _sync(session, "--group", "docs")
    out = Path(session.virtualenv.location)
    site, screenshots = out / "site", out / "screenshots"
    # Material prints a banner about its end of life on every build (why we stay on
    # it for now: the head of mkdocs.yml)
    env = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env=env)
    session.run(
        "pytest",
        "tests/test_docs.py",
        "tests/test_site.py",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env={
            **env,
            "STATEKEEPER_SITE_DIR": str(site),
            "STATEKEEPER_SITE_SCREENSHOTS": str(screenshots),
        },
    )
    session.log(f"site: {site / 'index.html'}; screenshots: {screenshots}")


@nox.session(python=PYTHON)
def reliability(session: nox.Session) -> None:
    """Crash, fault-injection, concurrency and hostile-input suite (--long for deeper runs)."""
    # the Redis plugin runs through the shared suite too, so install the workspace
    _sync(session, "--all-packages")
    workers, env = _pytest_workers(session)
    session.run(
        "pytest",
        "tests",
        "-m",
        "reliability",
        "-p",
        "no:cacheprovider",
        *workers,
        *session.posargs,
        env=env,
    )


@nox.session(python=PYTHON)
def redis(session: nox.Session) -> None:
    """The statekeeper-redis distribution, installed beside the core, against real Redis."""
    _sync(session, "--package", "statekeeper-redis")
    session.run("mypy", "--strict", "backends/statekeeper-redis/src")
    session.run(
        "pytest",
        "backends/statekeeper-redis/tests",
        "-p",
        "no:cacheprovider",
        "-p",
        "statekeeper_progress",
        env={"PYTHONPATH": PLUGINS},
    )


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmark, timed by pyperf, and docs/benchmarks.md: single saves against
    LangGraph's savers and the bare floors, the thread hop, WAL frames per commit,
    reads and listings, group commit and writer processes, batch access, under
    LangGraph and Agent Framework, encryption, telemetry, retention sweeps (saves'
    p99 beside them, space given back) and start-up (not in the default set; about
    40 minutes). ``-- --quick`` runs each workload once at small sizes, ``-- --only
    RE`` a subset, ``-- --large`` adds the reads at 100,000 checkpoints, ``-- --rev
    REV -o FILE.json.gz`` another commit's src/, ``-- --docs --before FILE.json.gz``
    writes the page with a before/after table."""
    _sync(session, "--group", "bench")
    # the peers are pinned in benchmarks/requirements.txt and live only in this env
    session.install("-r", "benchmarks/requirements.txt")
    session.run("python", "benchmarks/run.py", *session.posargs)
