"""Old home of ``StorePrimitives``, now :mod:`statekeeper._core.primitives`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.primitives import StoreIdentity, StorePrimitives

__all__ = ["StoreIdentity", "StorePrimitives"]
