"""The built-in backends, one package each: ``memory`` (``memory://``, the official
fake), ``file`` (``file://``, a directory of checksummed records) and ``sql``
(``sqlite://``, ``postgresql://``, ``mysql://``, on SQLAlchemy Core). The registry
imports each lazily, by scheme."""
