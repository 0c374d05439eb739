"""Old home of ``verify()`` and ``repair()``, now :mod:`statekeeper._core.integrity`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.integrity import (
    PAGE,
    RecordWalker,
    Verifiable,
    damaged_problem,
    repair_records,
    verify_store,
)

__all__ = [
    "PAGE",
    "RecordWalker",
    "Verifiable",
    "damaged_problem",
    "repair_records",
    "verify_store",
]
