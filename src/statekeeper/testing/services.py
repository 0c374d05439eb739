"""Real-service URLs for tests that need a database server.

Tests that need PostgreSQL, MariaDB/MySQL or Redis call :func:`service_url`. It
reads the URL from an environment variable; without it the test skips with a
clear reason. When ``STATEKEEPER_REQUIRE_SERVICES=1`` (``.ci/run`` sets it) a
missing URL or an unreachable server is a failure instead, so CI can never go
green by skipping the real-database tests.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

__all__ = ["SERVICE_ENV", "require_services", "service_url"]

SERVICE_ENV = {
    "postgres": "STATEKEEPER_TEST_POSTGRES_URL",
    "mysql": "STATEKEEPER_TEST_MYSQL_URL",
    "redis": "STATEKEEPER_TEST_REDIS_URL",
}


def require_services() -> bool:
    """Whether a missing service must fail the run instead of skipping (CI)."""
    return os.environ.get("STATEKEEPER_REQUIRE_SERVICES", "") not in ("", "0", "false")


def service_url(name: str) -> str:
    """The URL of service ``name`` (``postgres``, ``mysql``, ``redis``), or skip/fail."""
    env = SERVICE_ENV[name]
    url = os.environ.get(env, "")
    problem = None
    if not url:
        problem = f"{env} is not set; set it to a {name} URL to run this test"
    else:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port
        if port is not None:
            try:
                socket.create_connection((host, port), timeout=2).close()
            except OSError as exc:
                problem = f"{name} at {host}:{port} (from {env}) is unreachable: {exc}"
    if problem is not None:
        # Imported here: the workloads import this package, and must not pay for pytest.
        import pytest

        if require_services():
            pytest.fail(f"{problem} (STATEKEEPER_REQUIRE_SERVICES is set, so this is a failure)")
        pytest.skip(problem)
    return url
