"""The core contract: what every backend shares, written once.

Data flows downward through these modules; none imports one that imports it back
(``TYPE_CHECKING`` imports included). A helper takes what it uses (the primitives
it calls, the clock, the codecs, the cursor signer), never the whole store.

From the bottom up:

- ``validate``: argument checks (stream names, ids, tags, limits, metadata
  filters) and the id and etag makers.
- ``interface``: ``CheckpointStore``, the Protocol applications type against, the
  ``Order`` and ``TTL`` argument types, and ``StoreInfo``.
- ``query``: what a scan is asked and answers (``ScanQuery``, ``PageScan``) and
  where a listed page's probe goes (``probe_bound``, ``probe_query``).
- ``codecs``: a store's codecs built from its options, and the strict decode of a
  record.
- ``integrity``: ``verify()`` and ``repair()``, the parts every backend shares
  (``repair_records`` is public for backend authors).
- ``primitives``: ``StorePrimitives``, what a backend implements, and the
  defaults of the optional primitives; ``StoreIdentity``.
- ``writes``: arguments of ``save``, ``import_checkpoint`` and ``update`` turned
  into records (validated and encoded; nothing written), and ``update``'s body.
- ``paging``: ``list()``: cursors turned into keyset scans.
- ``batch``: the bodies of ``load_many``, ``cursor_at``, ``save_many`` and
  ``delete_many``.
- ``sealing``: encryption at rest (S16): ``SealedPrimitives``, a backend's
  primitives with every record sealed on the way in and opened on the way out,
  and ``Encryption``, a store's ``encryption=`` option resolved.
- ``rekey``: rotation and migration (``statekeeper rekey``), and the
  ``"retired-key"`` notices of ``verify()``.
- ``retention``: ``sweep()`` and ``compact()`` (S17): one sweep of a retention
  policy over the primitives, and the background sweep of ``sweep_every``.
- ``store``: ``BaseCheckpointStore``, every public method, checking that the store
  is open and handing the rest to the modules above.
"""
