"""Known failures of the file backend under the conformance kit, marked where they
are collected so that the kit itself stays the same for every backend."""

from __future__ import annotations

import pytest

#: A bug, not a flaky test: three concurrent sweeps over two instances of one file
#: store report 50 checkpoints removed where 46 went (4 counted twice), in about half
#: the runs on a 2-core machine, at 8c6c373 as at the commit that marked it; not yet
#: known whether anything beyond the count is wrong (the count is asserted first).
#: Not strict, so a run that does not hit it shows as XPASS.
_DOUBLE_COUNT = pytest.mark.xfail(
    strict=False,
    reason="file store: concurrent sweeps over two instances can count 4 removals twice "
    "(a known bug, not yet found)",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/file/test_file_conformance.py") and (
            "test_concurrent_sweeps_remove_each_checkpoint_once_and_count_true" in item.name
        ):
            item.add_marker(_DOUBLE_COUNT)
