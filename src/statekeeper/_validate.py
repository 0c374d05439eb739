"""Old home of the argument checks, now :mod:`statekeeper._core.validate`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.validate import (
    ID_PATTERN,
    MAX_BATCH,
    MAX_FILTER_KEYS,
    MAX_LIMIT,
    MAX_STREAM_LEN,
    MAX_TAG_KEY_LEN,
    MAX_TAG_VALUE_LEN,
    MAX_TAGS,
    Scalar,
    check_id,
    check_ids,
    check_if_match,
    check_limit,
    check_metadata_filter,
    check_stream,
    check_tags,
    metadata_matches,
    new_etag,
    new_id,
    scalar_kind,
    skipped_from,
)

__all__ = [
    "ID_PATTERN",
    "MAX_BATCH",
    "MAX_FILTER_KEYS",
    "MAX_LIMIT",
    "MAX_STREAM_LEN",
    "MAX_TAGS",
    "MAX_TAG_KEY_LEN",
    "MAX_TAG_VALUE_LEN",
    "Scalar",
    "check_id",
    "check_ids",
    "check_if_match",
    "check_limit",
    "check_metadata_filter",
    "check_stream",
    "check_tags",
    "metadata_matches",
    "new_etag",
    "new_id",
    "scalar_kind",
    "skipped_from",
]
