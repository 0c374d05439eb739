"""The SQL backend's schema: the tables and the statements run against them.

Every statement the backend runs is built here, once, with SQLAlchemy Core and
bound parameters (the migrations' DDL is in :mod:`.migrations`); what differs
per dialect (column types, table options, the counter's guard, the stream order,
a few statements of its own) comes from the store's :class:`~.dialects.Dialect`,
and PostgreSQL's lean path has its own (:mod:`.postgres.statements`, which reuses
these where they agree).

Tables (``p`` is the table prefix, default ``statekeeper_``)::

    p meta          name PK, value                  schema_version, store_id, cursor_key, ...
    p counter       name PK, hwm                    one row: the sequence high-water mark
                                                    (SQLite: of deleted checkpoints only,
                                                    kept by a trigger, sqlite/high_water.py)
    p checkpoints   seq PK, id UNIQUE, stream,      one row per checkpoint; ``record`` is the
                    expires_at, record              checksummed envelope (record.py)
                    INDEX (stream, seq), INDEX (expires_at)
    p tags          seq FK CASCADE, key, vkey,      one row per tag of a checkpoint
                    value, shash
                    PK (seq, key), INDEX (key, vkey, shash, seq), INDEX (key, vkey, seq)
    p fields        seq FK CASCADE, key, kind,      one row per scalar top-level metadata
                    vkey, value, shash              value of a checkpoint (schema version 2)
                    PK (seq, key), INDEX (key, kind, vkey, shash, seq),
                    INDEX (key, kind, vkey, seq)

``expires_at`` is microseconds since the Unix epoch (UTC), so expiry comparisons are
exact integer comparisons on every dialect. ``vkey`` is the tag value, or a hash of
it when the value is long, so that the tag indexes stay under every dialect's key
size limit; ``shash`` is a 64-bit hash of the stream, so that a tag-filtered page of
one stream is an index range too. Both are only index keys: every query rechecks
the full ``value`` and ``stream``, so a hash collision costs a row visit, never a
wrong answer. The fields table indexes metadata the same way, with the JSON kind
of each value (:func:`.values.field_value`), so that ``True`` never matches ``1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Protocol

import sqlalchemy as sa
from sqlalchemy.sql import Executable

from .values import FIELD_KEY_MAX, FIELD_VALUE_MAX, VKEY_INLINE

__all__ = [
    "SCHEMA_VERSION",
    "SchemaDialect",
    "Statements",
    "Tables",
    "build_tables",
]

#: The schema version this code writes. A store with a higher version is refused.
SCHEMA_VERSION = 3


class SchemaDialect(Protocol):
    """What the tables and statements ask of a dialect: the part of
    :class:`~.dialects.Dialect` (which implements it) that shapes them."""

    def text(self, chars: int) -> sa.types.TypeEngine[str]: ...
    def key(self) -> sa.types.TypeEngine[int]: ...
    def blob(self) -> sa.types.TypeEngine[bytes]: ...
    def table_options(self) -> dict[str, Any]: ...
    def keyed_table_options(self) -> dict[str, Any]: ...
    def partial_index(self, where: sa.ColumnElement[bool]) -> dict[str, Any]: ...
    def code_point_order(self, column: sa.ColumnElement[str]) -> sa.ColumnElement[str]: ...


@dataclass(frozen=True)
class Tables:
    """The tables of one store (one prefix in one schema)."""

    metadata: sa.MetaData
    meta: sa.Table
    counter: sa.Table
    checkpoints: sa.Table
    tags: sa.Table
    fields: sa.Table
    #: PostgreSQL only: ``(stream COLLATE "C")``, for exact prefix ranges of stream
    #: names whatever the database's collation. Not in ``checkpoints.indexes``, so
    #: that only the PostgreSQL migration creates it.
    pg_stream_c: sa.Index

    @property
    def all(self) -> tuple[sa.Table, ...]:
        """In creation order (tags and fields reference the checkpoints table)."""
        return (self.meta, self.counter, self.checkpoints, self.tags, self.fields)


def build_tables(prefix: str, schema: str | None, dialect: SchemaDialect) -> Tables:
    """The table definitions for ``prefix`` in ``schema`` (``None``: the default schema),
    with the column types and table options of ``dialect``."""
    md = sa.MetaData(schema=schema)
    opts = dialect.table_options()
    _text, _bigint, _blob = dialect.text, dialect.key, dialect.blob
    meta = sa.Table(
        f"{prefix}meta",
        md,
        sa.Column("name", _text(64), primary_key=True),
        sa.Column("value", _text(255), nullable=False),
        **opts,
    )
    counter = sa.Table(
        f"{prefix}counter",
        md,
        sa.Column("name", _text(64), primary_key=True),
        sa.Column("hwm", sa.BigInteger(), nullable=False),
        **opts,
    )
    cp = sa.Table(
        f"{prefix}checkpoints",
        md,
        sa.Column("seq", _bigint(), primary_key=True, autoincrement=False),
        sa.Column("id", _text(200), nullable=False),
        sa.Column("stream", _text(512), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("record", _blob(), nullable=False),
        **opts,
    )
    sa.Index(f"{prefix}checkpoints_id", cp.c.id, unique=True)
    sa.Index(f"{prefix}checkpoints_stream_seq", cp.c.stream, cp.c.seq)
    sa.Index(
        f"{prefix}checkpoints_expires",
        cp.c.expires_at,
        **dialect.partial_index(cp.c.expires_at.is_not(None)),
    )
    tags = sa.Table(
        f"{prefix}tags",
        md,
        sa.Column(
            "seq",
            _bigint(),
            sa.ForeignKey(cp.c.seq, ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("key", _text(128), primary_key=True),
        sa.Column("vkey", _text(VKEY_INLINE), nullable=False),
        sa.Column("value", _text(1024), nullable=False),
        sa.Column("shash", sa.BigInteger(), nullable=False),
        # (SQLite: WITHOUT ROWID since schema version 3, which rebuilt older ones)
        **dialect.keyed_table_options(),
        **opts,
    )
    sa.Index(f"{prefix}tags_stream", tags.c.key, tags.c.vkey, tags.c.shash, tags.c.seq)
    sa.Index(f"{prefix}tags_global", tags.c.key, tags.c.vkey, tags.c.seq)
    fields = sa.Table(
        f"{prefix}fields",
        md,
        sa.Column(
            "seq",
            _bigint(),
            sa.ForeignKey(cp.c.seq, ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("key", _text(FIELD_KEY_MAX), primary_key=True),
        sa.Column("kind", _text(8), nullable=False),
        sa.Column("vkey", _text(VKEY_INLINE), nullable=False),
        sa.Column("value", _text(FIELD_VALUE_MAX), nullable=False),
        sa.Column("shash", sa.BigInteger(), nullable=False),
        **dialect.keyed_table_options(),
        **opts,
    )
    sa.Index(
        f"{prefix}fields_stream",
        fields.c.key,
        fields.c.kind,
        fields.c.vkey,
        fields.c.shash,
        fields.c.seq,
    )
    sa.Index(f"{prefix}fields_global", fields.c.key, fields.c.kind, fields.c.vkey, fields.c.seq)
    pg_stream_c = sa.Index(
        f"{prefix}checkpoints_stream_c",
        dialect.code_point_order(cp.c.stream),
        info={"dialect": "postgresql"},
    )
    cp.indexes.discard(pg_stream_c)
    return Tables(md, meta, counter, cp, tags, fields, pg_stream_c)


# -- statements -----------------------------------------------------------------------

COUNTER_NAME = "sequence"


def _p(name: str, type_: sa.types.TypeEngine[Any] | None = None) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


class Statements:
    """Every statement the backend runs for one dialect, built once and cached by shape.

    Statements are cached so that a dialect that compiles them itself (SQLite, see
    :mod:`.sqlite`) compiles each shape once, and SQLAlchemy's own compiled
    cache hits for the others. One instance serves one dialect only: the few
    dialect-specific statements (:attr:`dialect_cache`) are built for
    the dialect it was built with, and compiling one under another dialect fails.
    """

    def __init__(self, tables: Tables, dialect: SchemaDialect) -> None:
        self.t = tables
        cp, meta, counter, tags = tables.checkpoints, tables.meta, tables.counter, tables.tags
        fields = tables.fields
        live = sa.or_(cp.c.expires_at.is_(None), cp.c.expires_at > _p("now"))
        self.live = live
        self.read_meta = sa.select(meta.c.name, meta.c.value)
        self.insert_meta = meta.insert()
        self.insert_counter = counter.insert().values(name=COUNTER_NAME, hwm=0)
        self.read_hwm = sa.select(counter.c.hwm).where(counter.c.name == COUNTER_NAME)
        self.max_seq = sa.select(sa.func.coalesce(sa.func.max(cp.c.seq), 0))
        # The bump refuses (matches no row) when the counter is not above every
        # sequence in the table: a damaged or lowered counter must fail the save,
        # never hand out a sequence below an existing one. max(seq) is one index
        # probe; a stale snapshot of it only makes the guard weaker, never wrong.
        self.counter_sane = [
            counter.c.name == COUNTER_NAME,
            counter.c.hwm + 1 > self.max_seq.scalar_subquery(),
        ]
        # :step is how many sequences one transaction takes (a save_many takes all
        # of its batch at once, so they are consecutive).
        self.step = _p("step", sa.BigInteger())
        self.bump = (
            counter.update()
            .where(*self.counter_sane)
            .values(hwm=counter.c.hwm + self.step)
            .returning(counter.c.hwm)
        )
        self.insert_cp = cp.insert()
        self.insert_tag = tags.insert()
        self.insert_field = fields.insert()
        ids: sa.BindParameter[list[str]] = sa.bindparam("ids", expanding=True)
        self.get_many = sa.select(cp.c.seq, cp.c.id, cp.c.record).where(cp.c.id.in_(ids), live)
        self.ids_taken = sa.select(cp.c.seq, cp.c.id, cp.c.expires_at).where(cp.c.id.in_(ids))
        self.delete_many = cp.delete().where(cp.c.id.in_(ids), live)
        self.delete_seqs = cp.delete().where(cp.c.seq.in_(sa.bindparam("seqs", expanding=True)))
        # Code point order is byte order in SQLite (BINARY) and MySQL (VARBINARY).
        name = dialect.code_point_order(cp.c.stream)
        self.streams_from = sa.select(cp.c.stream).where(name >= _p("lo"), live).distinct()
        self.streams_between = self.streams_from.where(name < _p("hi"))
        self.delete_expired_id = cp.delete().where(
            cp.c.id == _p("id"), cp.c.expires_at.is_not(None), cp.c.expires_at <= _p("now")
        )
        self.get = sa.select(cp.c.seq, cp.c.record).where(cp.c.id == _p("id"), live)
        self.get_for_update = (
            sa.select(cp.c.seq, cp.c.record, cp.c.expires_at)
            .where(cp.c.id == _p("id"))
            .with_for_update()
        )
        # Parameters of UPDATE statements must not be named like columns.
        self.set_record = (
            cp.update()
            .where(cp.c.seq == _p("at_seq"))
            .values(record=_p("new_record"), expires_at=_p("new_expires_at"))
        )
        self.delete_seq = cp.delete().where(cp.c.seq == _p("seq"))
        self.delete_live_id = cp.delete().where(cp.c.id == _p("id"), live)
        self.latest = (
            sa.select(cp.c.seq, cp.c.id, cp.c.record)
            .where(cp.c.stream == _p("stream"), live)
            .order_by(cp.c.seq.desc())
            .limit(1)
        )
        self.delete_stream_live = cp.delete().where(cp.c.stream == _p("stream"), live)
        self.delete_stream_all = cp.delete().where(cp.c.stream == _p("stream"))
        self.prune_cutoff = (
            sa.select(cp.c.seq)
            .where(cp.c.stream == _p("stream"), live)
            .order_by(cp.c.seq.desc())
            .limit(1)
            .offset(_p("skip", sa.Integer()))
        )
        self.prune_below = cp.delete().where(
            cp.c.stream == _p("stream"), cp.c.seq < _p("cutoff"), live
        )
        self.purge = cp.delete().where(cp.c.expires_at.is_not(None), cp.c.expires_at <= _p("now"))
        self.streams = sa.select(cp.c.stream).where(live).distinct()
        # info(): live checkpoints and their streams, and expired ones not yet purged
        self.count = sa.select(sa.func.count()).select_from(cp).where(live)
        self.count_streams = sa.select(sa.func.count(sa.distinct(cp.c.stream))).where(live)
        self.count_expired = (
            sa.select(sa.func.count())
            .select_from(cp)
            .where(cp.c.expires_at.is_not(None), cp.c.expires_at <= _p("now"))
        )
        self.raw_read = sa.select(cp.c.record).where(cp.c.id == _p("id"))
        self.raw_write = cp.update().where(cp.c.id == _p("at_id")).values(record=_p("new_record"))
        # -- verify and repair (.integrity)
        self.set_hwm = (
            counter.update().where(counter.c.name == COUNTER_NAME).values(hwm=_p("new_hwm"))
        )
        self.insert_hwm = counter.insert().values(name=COUNTER_NAME, hwm=_p("new_hwm"))
        self.max_tag_seq = sa.select(sa.func.coalesce(sa.func.max(tags.c.seq), 0))
        self.delete_meta_name = meta.delete().where(meta.c.name == _p("at_name"))
        self.rows_after = (
            sa.select(cp.c.seq, cp.c.id, cp.c.stream, cp.c.expires_at, cp.c.record)
            .where(cp.c.seq > _p("after"))
            .order_by(cp.c.seq)
            .limit(_p("limit", sa.Integer()))
        )
        self.rows_after_locked = self.rows_after.with_for_update()
        self.newest_records = (
            sa.select(cp.c.seq, cp.c.record)
            .order_by(cp.c.seq.desc())
            .limit(_p("limit", sa.Integer()))
        )
        self.tags_between = sa.select(
            tags.c.seq, tags.c.key, tags.c.vkey, tags.c.value, tags.c.shash
        ).where(tags.c.seq >= _p("lo"), tags.c.seq <= _p("hi"))
        orphan = ~sa.exists().where(cp.c.seq == tags.c.seq)
        self.orphan_tags = sa.select(tags.c.seq).where(orphan).distinct().order_by(tags.c.seq)
        self.delete_orphan_tags = tags.delete().where(orphan)
        self.delete_tags_seq = tags.delete().where(tags.c.seq == _p("at_seq"))
        self.max_field_seq = sa.select(sa.func.coalesce(sa.func.max(fields.c.seq), 0))
        self.fields_between = sa.select(
            fields.c.seq, fields.c.key, fields.c.kind, fields.c.vkey, fields.c.value, fields.c.shash
        ).where(fields.c.seq >= _p("lo"), fields.c.seq <= _p("hi"))
        orphan_f = ~sa.exists().where(cp.c.seq == fields.c.seq)
        self.orphan_fields = (
            sa.select(fields.c.seq).where(orphan_f).distinct().order_by(fields.c.seq)
        )
        self.delete_orphan_fields = fields.delete().where(orphan_f)
        self.delete_fields_seq = fields.delete().where(fields.c.seq == _p("at_seq"))
        self.delete_all_fields = fields.delete()
        self.set_columns = (
            cp.update()
            .where(cp.c.seq == _p("at_seq"))
            .values(id=_p("new_id"), stream=_p("new_stream"), expires_at=_p("new_expires_at"))
        )
        self.scan = cache(self._scan)
        #: Dialect-specific statements, built on first use
        #: (:meth:`.dialects.Dialect.statement`).
        self.dialect_cache: dict[str, Executable] = {}

    def _scan(
        self,
        has_stream: bool,
        order: Literal["asc", "desc"],
        has_bound: bool,
        ntags: int,
        nmeta: int = 0,
        horizon: bool = False,
    ) -> Executable:
        """A keyset page: live rows ``(seq, id, record)`` beyond ``:bound`` in ``order``.

        With filters, the first tag (else the first metadata key) drives the query
        through its index, which yields rows already in sequence order (so the
        ``LIMIT`` stops early); the other filters are checked per row through the
        primary key ``(seq, key)`` of the tags or fields table.

        ``horizon`` (PostgreSQL, :mod:`.postgres.statements`) keeps only rows below ``hz.h``, a CTE
        the caller wraps around the statement.
        """
        cp, tags, fields = self.t.checkpoints, self.t.tags, self.t.fields
        cols = (cp.c.seq, cp.c.id, cp.c.record)
        conds: list[sa.ColumnElement[bool]] = [self.live]
        key_col: sa.ColumnElement[int] = cp.c.seq
        query = sa.select(*cols)
        if ntags:
            t0 = tags.alias("t0")
            key_col = t0.c.seq
            query = sa.select(*cols).select_from(t0.join(cp, cp.c.seq == t0.c.seq))
            conds += [t0.c.key == _p("k0"), t0.c.vkey == _p("vk0"), t0.c.value == _p("v0")]
            if has_stream:
                conds.append(t0.c.shash == _p("shash"))
        elif nmeta:
            f0 = fields.alias("f0")
            key_col = f0.c.seq
            query = sa.select(*cols).select_from(f0.join(cp, cp.c.seq == f0.c.seq))
            conds += [
                f0.c.key == _p("mk0"),
                f0.c.kind == _p("mt0"),
                f0.c.vkey == _p("mvk0"),
                f0.c.value == _p("mv0"),
            ]
            if has_stream:
                conds.append(f0.c.shash == _p("shash"))
        for i in range(1, ntags):
            ti = tags.alias(f"t{i}")
            conds.append(
                sa.exists()
                .where(ti.c.seq == cp.c.seq, ti.c.key == _p(f"k{i}"), ti.c.value == _p(f"v{i}"))
                .correlate(cp)
            )
        for i in range(0 if ntags else 1, nmeta):
            fi = fields.alias(f"f{i}")
            conds.append(
                sa.exists()
                .where(
                    fi.c.seq == cp.c.seq,
                    fi.c.key == _p(f"mk{i}"),
                    fi.c.kind == _p(f"mt{i}"),
                    fi.c.value == _p(f"mv{i}"),
                )
                .correlate(cp)
            )
        if has_stream:
            conds.append(cp.c.stream == _p("stream"))
        if has_bound:
            conds.append(key_col > _p("bound") if order == "asc" else key_col < _p("bound"))
        if horizon:
            conds.append(cp.c.seq < sa.literal_column("(SELECT hz.h FROM hz)"))
        ordering = key_col.asc() if order == "asc" else key_col.desc()
        return query.where(*conds).order_by(ordering).limit(_p("limit", sa.Integer()))
