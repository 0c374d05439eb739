"""``codec="raw"``: state is ``bytes``, stored verbatim and returned as ``bytes``.

For callers that bring their own serializer (LangGraph's and Agent Framework's
integrations store their framework's bytes this way): no base64, no JSON, no
tagged values. Records name their codec (``"raw"`` or ``"sk-json/1"``), so a
store reads records of either codec whatever its own ``codec`` option says; the
option only decides how new states are encoded.

Symmetry (S5) holds as for JSON: ``save`` refuses, with
:class:`~statekeeper.errors.CheckpointEncodeError` and nothing written, anything
that is not ``bytes`` and anything over ``max_bytes``, which is what ``load``
would refuse.

The code lives in :mod:`statekeeper.codec.raw`; this is its documented import path.
"""

from __future__ import annotations

from statekeeper.codec.raw import RawCodec

__all__ = ["RawCodec"]
