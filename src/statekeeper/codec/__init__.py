"""The checkpoint codecs: ``sk-json/1`` (JSON plus tagged values, with an allowlist)
and ``raw`` (bytes verbatim).

This package is the only place that turns state into bytes and back. There is no pickle:
decoding never imports a module, never looks up an attribute by a name taken from
the data, and calls only the classes listed in ``allowed_types``.

Format
======

One UTF-8 JSON document, compact, without NaN tokens. ``dict`` with ``str`` keys,
``list``, ``str``, ``int``, ``float``, ``bool`` and ``None`` are themselves; every
other value is a *tagged value*, a JSON object whose reserved key ``"$sk"`` names
the tag:

=============  ================================================================
``datetime``   ``{"$sk":"datetime","v":"2026-01-01T00:00:00.000001+00:00"}``,
               plus ``"fold":1`` when ``fold`` is set and ``"tz"`` (below)
``date``       ``{"$sk":"date","v":"2026-01-01"}``
``time``       ``{"$sk":"time","v":"12:30:00+02:00"}`` (and ``"fold":1``)
``timedelta``  ``{"$sk":"timedelta","v":86400000000}``: total microseconds
``uuid``       ``{"$sk":"uuid","v":"1b4e28ba-2fa1-11d2-883f-0016d3cca427"}``
``decimal``    ``{"$sk":"decimal","v":"-1.50E+3"}``: ``str()``, exact
``bytes``      ``{"$sk":"bytes","v":"AAEC"}``: standard base64
``tuple``      ``{"$sk":"tuple","v":[1,2]}``; ``set`` and ``frozenset`` alike
``dict``       ``{"$sk":"dict","v":[[1,"a"],[[2,3],"b"]]}``: ``[key, value]``
               pairs, for a dict with a non-``str`` key or a ``"$sk"`` key of its
               own, so user data is never mistaken for a tag
``float``      ``{"$sk":"float","v":"nan"}`` (``"inf"``, ``"-inf"``), only with
               ``allow_nan``
``enum``       ``{"$sk":"enum","t":"app.models:Color","v":1}``: the member's
               value, decoded as ``Color(1)``
``model``      ``{"$sk":"model","t":"app.models:Order","v":{"id":1}}``: fields by
               name (and extras), decoded with ``Order.model_validate`` so
               validators run; for a ``RootModel`` ``"v"`` is the root value
``dataclass``  ``{"$sk":"dataclass","t":"app.models:Point","v":{"x":1}}``: every
               field; decoded by calling the class with the ``init`` fields,
               then setting the others
=============  ================================================================

Types are exact: whatever ``encode`` accepts comes back ``==`` with the same type
at every level. Subclasses of the builtins (``IntEnum`` without the allowlist, a
``str`` subclass, ``OrderedDict``, ``defaultdict``) are refused, never downgraded.
Sets are written in iteration order.

Time zones: a ``datetime`` whose tzinfo is a ``ZoneInfo`` keeps its zone by name,
``{"$sk":"datetime","v":"2026-11-01T01:30:00-05:00","tz":"America/New_York","fold":1}``,
and comes back with that very ``ZoneInfo`` (wall time, zone and fold win over the
offset if the tz database changed). Names must have the IANA syntax and are loaded
by ``zoneinfo``: data, never code. Any other tzinfo (``timezone``, pytz, dateutil,
``ZoneInfo.no_cache``, every ``time``) is stored as its fixed UTC offset and comes
back ``==`` with a ``datetime.timezone``; an ambiguous or skipped wall time in such
a zone is refused, since Python never finds it equal to its fixed-offset copy, and
so is a tzinfo whose ``utcoffset()`` is ``None``.

The allowlist
=============

Enum members (``IntEnum``, ``StrEnum``, ``Flag`` too), pydantic v2 models and
dataclass instances carry their class as ``"module:Qualname"`` and are encoded and
decoded only if that exact class is in ``allowed_types``, given as classes or as
``"module:Qualname"`` strings (imported once, when the codec is built). At decode
time a name is only looked up in that list: a tag naming ``"os:system"`` is a
:class:`~statekeeper.errors.CheckpointDecodeError`.

Limits and NaN
==============

:class:`CodecLimits`, defaults in :data:`DEFAULT_LIMITS`:

- ``max_depth=100`` (at most 500): nesting of JSON arrays and objects in the
  document. A tag is an object, so it counts one level; a ``tuple``, ``set`` or
  ``frozenset`` tag counts two and a ``dict`` tag three.
- ``max_bytes=16 MiB``: the size of the document, checked before parsing.
- ``max_int_digits=4300``: decimal digits of any ``int``, as in Python's own limit.
- ``allow_nan=False``: NaN and infinities (``float`` and ``Decimal``) are refused
  both ways. With ``True`` they round-trip as tags in state, and ``NaN``/``Infinity``
  tokens written by other tools are accepted too; metadata refuses them either way
  (it is stored as strict JSON in the record header and the index rows).

Save/load symmetry (S5): ``encode`` raises
:class:`~statekeeper.errors.CheckpointEncodeError`, naming the part
(``state['a'][3]``), for exactly what ``decode`` would refuse: a class off the
allowlist, an unsupported type, a limit, NaN, a lone surrogate (not UTF-8), a
reference cycle. ``decode`` raises :class:`~statekeeper.errors.CheckpointDecodeError`
and nothing else: invalid UTF-8 or JSON, duplicate keys, a limit, a bad tag.

Fast paths: ``encode`` hands plain JSON of exact types (checked by a walk that
builds nothing: no subclass, no ``"$sk"`` key, finite floats, ints and depth within
the limits) to msgspec as it is, and everything else through the tagging walk,
whose output msgspec writes too. ``decode`` lets msgspec parse bytes and keeps the
result only if re-encoding it gives back the very same bytes, with no tag, within
the limits; anything else (and every error) goes through the reference decoder, so
values, types and error messages are the same either way
(``tests/core/test_codec_fast_path.py`` checks both differentially).

Modules
=======

Data flows one way: ``sk_json`` uses ``encode`` and ``decode``, which use ``tags``,
which uses ``allowlist``; none imports a module above it.

- ``limits``: :class:`CodecLimits` and :data:`DEFAULT_LIMITS`.
- ``allowlist``: resolves ``allowed_types`` once (the only import of a class by
  name), and looks classes up by exact type and by tag name.
- ``tags``: one encoder and one decoder per tagged value; they receive the walk
  they need (the small ``Walk`` and ``Lookup`` protocols), never the codec.
- ``encode``: the encoder walk (plain JSON straight to msgspec, the rest tagged),
  the metadata check and the wording of every refusal.
- ``decode``: the decoder (``json`` with the duplicate-key and tag hooks; msgspec
  for the canonical plain form, verified by writing it again).
- ``sk_json``: :class:`Codec`, the allowlist, encoder and decoder put together.
- ``raw``: :class:`~statekeeper.rawcodec.RawCodec` (``codec="raw"``), documented
  and imported as ``statekeeper.rawcodec``.

Where a codec sits: a store encodes a state here, and the record envelope
(:mod:`statekeeper.record`) carries the bytes and names the codec. A layer that
transforms state bytes (encryption at rest) goes between the two: it wraps the
bytes a codec wrote before the envelope takes them, and unwraps them before
``decode``; codecs stay unaware of it.
"""

from __future__ import annotations

from statekeeper.codec.limits import DEFAULT_LIMITS, CodecLimits
from statekeeper.codec.sk_json import Codec

__all__ = ["DEFAULT_LIMITS", "Codec", "CodecLimits"]
