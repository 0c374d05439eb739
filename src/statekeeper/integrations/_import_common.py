"""What every ``statekeeper import`` source shares: the result it reports, and the
batches it reads in."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Advance", "ImportProblem", "ImportResult", "chunks"]

Advance = Callable[[int], None]


@dataclass(frozen=True)
class ImportProblem:
    """A source item that was not imported, and why."""

    location: str
    reason: str
    error: str

    def as_json(self) -> dict[str, str]:
        return {"location": self.location, "reason": self.reason, "error": self.error}


@dataclass
class ImportResult:
    """What an import did: items seen in the source, imported now, present from an
    earlier run, and the problems (unreadable items, conflicts)."""

    seen: int = 0
    imported: int = 0
    already_present: int = 0
    problems: list[ImportProblem] = field(default_factory=list)

    def problem(self, location: str, exc: BaseException | str) -> None:
        if isinstance(exc, BaseException):
            self.problems.append(ImportProblem(location, str(exc), type(exc).__name__))
        else:
            self.problems.append(ImportProblem(location, exc, "Conflict"))


def chunks(items: list[Any], size: int = 500) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
