"""Old home of the paging code, now :mod:`statekeeper._core.paging` and
:mod:`statekeeper._core.query`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.paging import list_page, scan, scan_page
from ._core.query import INLINE_PAGE_ROWS, Entry, PageScan, ScanQuery, probe_bound, probe_query

__all__ = [
    "INLINE_PAGE_ROWS",
    "Entry",
    "PageScan",
    "ScanQuery",
    "list_page",
    "probe_bound",
    "probe_query",
    "scan",
    "scan_page",
]
