"""The SQL backend's integrity: what a store's tables should hold, checked on open
and by ``verify``, and rebuilt from the records by ``repair`` (records are the
truth, SPEC S3a). The modules:

- :mod:`.upkeep`: :class:`~.upkeep.Upkeep`, one store's table work: opening (the
  meta probe, migrations under the migration lock), ``verify`` and ``repair``.
- :mod:`.derived`: the rows derived from the records (meta, counter, row columns,
  tag and fields rows, orphans): their checks and rebuilds.
- :mod:`.store_ids`: the store id the records carry, which decides over a damaged
  ``store_id`` meta row.
- :mod:`.schema_check`: the tables and indexes a schema version needs, checked by
  ``verify`` and recreated by ``repair``.
"""
