"""The conformance kit's third-party dependencies, and what to say when one is missing.

The kit (``CheckpointStoreTests``, the state machine, the strategies) needs
pytest, pytest-asyncio and Hypothesis, from the ``testing`` extra. The rest of
``statekeeper.testing`` (workloads, invariants, history, recording, services)
needs none of them, so a workload child process starts without paying for them.
"""

from __future__ import annotations

__all__ = ["INSTALL_HINT", "KIT_DEPENDENCIES", "missing_dependency"]

#: Top-level module names of the kit's dependencies.
KIT_DEPENDENCIES = frozenset({"pytest", "_pytest", "pytest_asyncio", "hypothesis"})

INSTALL_HINT = (
    "install the testing extra: pip install 'statekeeper[testing]' "
    "(from a checkout of statekeeper: uv sync --extra testing)"
)


def missing_dependency(exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """``exc`` again, with the install hint, if it is about one of the kit's
    dependencies; otherwise ``exc`` itself."""
    name = exc.name or ""
    if name.partition(".")[0] not in KIT_DEPENDENCIES or INSTALL_HINT in str(exc):
        return exc
    return ModuleNotFoundError(
        f"the statekeeper conformance kit needs {name}, which cannot be imported ({exc}); "
        + INSTALL_HINT,
        name=name,
    )
