"""Old home of the record makers, now :mod:`statekeeper._core.writes`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.writes import TtlRule, check_ttl, imported_record, new_record, record_edits

__all__ = ["TtlRule", "check_ttl", "imported_record", "new_record", "record_edits"]
