"""What the Redis server promises about the writes it acknowledges, and the refusal
that keeps ``durability="full"`` honest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from statekeeper.errors import DurabilityUnavailable

__all__ = ["PERSISTENCE_SETTINGS", "ServerPersistence", "UnsafeDurabilityError"]

#: The server settings read on open (``CONFIG GET``).
PERSISTENCE_SETTINGS = ("appendonly", "appendfsync", "maxmemory-policy")

_OPT_OUT = (
    "pass allow_unsafe_durability=True (in a URL: ?allow_unsafe_durability=true) "
    "if you accept losing acknowledged checkpoints"
)


class UnsafeDurabilityError(DurabilityUnavailable):
    """The Redis server cannot keep the durability the store was opened with.

    Raised on open. Either configure the server (``appendonly yes`` plus
    ``appendfsync always`` for ``durability="full"``; ``appendonly yes`` for
    ``"fast"``; ``maxmemory-policy noeviction`` for both), or
    open the store with ``allow_unsafe_durability=True`` to accept the risk.
    """


@dataclass(frozen=True)
class ServerPersistence:
    """The persistence settings of a server, as read by ``CONFIG GET``.

    ``None`` values mean the setting could not be read (``CONFIG`` disabled or
    renamed, as on several managed services).
    """

    appendonly: str | None
    appendfsync: str | None
    maxmemory_policy: str | None
    unreadable: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> ServerPersistence:
        return cls(
            appendonly=config.get("appendonly"),
            appendfsync=config.get("appendfsync"),
            maxmemory_policy=config.get("maxmemory-policy"),
        )

    @classmethod
    def unknown(cls, reason: str) -> ServerPersistence:
        return cls(None, None, None, unreadable=reason)

    def problems(self, durability: str) -> list[str]:
        """Why this server can lose a write it acknowledged at ``durability``."""
        if self.unreadable is not None:
            return [
                f"the server's persistence settings cannot be read ({self.unreadable}), so "
                "statekeeper cannot check that acknowledged writes survive a restart; "
                "on a managed service whose CONFIG command is disabled, check its "
                "persistence settings yourself (AOF with fsync on every write for "
                "durability='full')"
            ]
        found: list[str] = []
        if self.maxmemory_policy not in (None, "noeviction"):
            found.append(
                f"maxmemory-policy is {self.maxmemory_policy!r}, so Redis deletes keys on "
                "its own under memory pressure ("
                + (
                    "checkpoints saved with a ttl, before they expire"
                    if self.maxmemory_policy.startswith("volatile-")
                    else "any checkpoint or index key"
                )
                + "): an evicted record is a lost checkpoint, an evicted index makes "
                "reads refuse until repair() (CONFIG SET maxmemory-policy noeviction)"
            )
        if self.appendonly != "yes":
            found.append(
                f"appendonly is {self.appendonly!r}, so a server restart loses every "
                "checkpoint written since the last snapshot (CONFIG SET appendonly yes"
                + (
                    ", and appendfsync always for durability='full')"
                    if durability == "full"
                    else ")"
                )
            )
        elif durability == "full" and self.appendfsync != "always":
            found.append(
                f"appendfsync is {self.appendfsync!r}, so power loss or an OS crash can "
                "lose writes Redis already acknowledged (durability='full' needs "
                "CONFIG SET appendfsync always; durability='fast' accepts everysec)"
            )
        return found

    def refuse(self, where: str, durability: str) -> UnsafeDurabilityError | None:
        """The error to raise on open, or ``None`` when the server is good enough."""
        found = self.problems(durability)
        if not found:
            return None
        return UnsafeDurabilityError(
            f"refusing to open {where} with durability={durability!r}: "
            + "; ".join(found)
            + f". Fix the server, or {_OPT_OUT}."
        )
