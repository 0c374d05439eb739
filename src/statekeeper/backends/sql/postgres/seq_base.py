"""PostgreSQL's sequence base: the ``seq_base`` meta row added to transaction ids.

Sequences are ``(transaction id + base) * SEQ_SLOTS + offset`` (:mod:`.sequences`).
``base`` keeps them above every stored sequence when a store is restored into a
cluster whose transaction ids are lower; it takes the place of the counter row of
the other dialects in ``verify`` (:func:`check_base`) and ``repair``
(:func:`rebuild_base`). Synchronous operations over a :class:`~..dialects.Session`.
"""

from __future__ import annotations

import sqlalchemy as sa

from ....models import Problem
from ..dialects import Session
from ..integrity.derived import top_sequence
from ..schema import Statements, Tables
from .statements import BASE_ROW, SEQ_SLOTS

__all__ = ["base_needed", "base_problem", "check_base", "parse_base", "raise_base", "rebuild_base"]

_NEXT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"


def base_needed(max_seq: int, next_xid: int) -> int:
    """The smallest base for which ``(next_xid + base) * SEQ_SLOTS > max_seq``."""
    return max_seq // SEQ_SLOTS - next_xid + 1


def parse_base(raw: str | None) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    if not text.lstrip("-").isdigit() or len(text) > 20:
        return None
    return int(text)


def raise_base(s: Session, tables: Tables) -> int:
    """Under the migration lock: set ``seq_base`` to at least what this cluster's
    transaction ids need to stay above every stored sequence; the value set."""
    meta, cp = tables.meta, tables.checkpoints
    raw = s.first(sa.select(meta.c.value).where(meta.c.name == BASE_ROW))
    top = s.first(sa.select(sa.func.coalesce(sa.func.max(cp.c.seq), 0)))
    nxt = s.first(sa.text(_NEXT_XID))
    assert top is not None and nxt is not None
    current = parse_base(None if raw is None else str(raw[0]))
    base = max(current or 0, base_needed(int(top[0]), int(nxt[0])))
    if raw is None:
        s.run(meta.insert().values(name=BASE_ROW, value=str(base)))
    elif current != base:
        s.run(meta.update().where(meta.c.name == BASE_ROW).values(value=str(base)))
    return base


def base_problem(raw: str | None, base: int | None, need: int) -> str:
    """Why the ``seq_base`` row cannot give safe sequences, and how to repair it."""
    if raw is None:
        what = f"the meta row {BASE_ROW!r} is missing"
    elif base is None:
        what = f"the meta row {BASE_ROW!r} holds {raw!r}, not an integer"
    else:
        what = (
            f"the meta row {BASE_ROW!r} is {base}, too low for this cluster's transaction "
            f"ids (at least {need} is needed to stay above every stored sequence)"
        )
    return f"{what}; opening the store writable, or store.repair(), raises it"


def _base_state(s: Session, st: Statements) -> tuple[str | None, int | None, int, int]:
    meta = st.t.meta
    row = s.first(sa.select(meta.c.value).where(meta.c.name == BASE_ROW))
    raw = None if row is None else str(row[0])
    nxt = s.first(sa.text(_NEXT_XID))
    assert nxt is not None
    return raw, parse_base(raw), top_sequence(s, st), int(nxt[0])


def check_base(s: Session, st: Statements) -> list[Problem]:
    """``verify``: the ``seq_base`` row is present, an integer, and high enough that
    ``(next transaction id + base) * 1024`` is above every stored sequence."""
    raw, base, top, nxt = _base_state(s, st)
    need = base_needed(top, nxt)
    if base is not None and base >= need:
        return []
    location = f"{st.t.meta.name}[name={BASE_ROW}]"
    return [Problem(kind="state", location=location, reason=base_problem(raw, base, need))]


def rebuild_base(s: Session, st: Statements) -> tuple[int, int] | None:
    """``repair``: raise the ``seq_base`` row where it is missing, damaged or too
    low; ``(old, new)`` if it changed."""
    raw, base, top, nxt = _base_state(s, st)
    if raw is not None and base is not None and base >= base_needed(top, nxt):
        return None
    return (base or 0, raise_base(s, st.t))
