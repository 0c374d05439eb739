"""Old home of the batch bodies, now :mod:`statekeeper._core.batch`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.batch import cursor_at, delete_many, load_many, save_many

__all__ = ["cursor_at", "delete_many", "load_many", "save_many"]
