"""The state every store saves: about 1 KB of agent-like JSON, identical for all."""

from __future__ import annotations

from typing import Any

_WORDS = [
    *("plan", "fetch", "parse", "rank", "merge", "check", "retry", "summarise", "route"),
    *("answer", "cache", "tool", "call", "result", "token", "budget", "window", "stream"),
    *("order", "history", "cursor", "page", "latest", "durable"),
]


def make_state(step: int) -> dict[str, Any]:
    """A deterministic state for ``step``: a short chat history plus scalar fields.

    Plain JSON types only, so no store needs a custom codec or an allowlist, and
    the same logical value goes into every store. Each encoder then adds its own
    framing (statekeeper's sk-json, LangGraph's msgpack, MAF's indented JSON).
    """
    text = " ".join(_WORDS[(step + i) % len(_WORDS)] for i in range(27))
    return {
        "step": step,
        "status": "running",
        "messages": [
            {"role": role, "content": f"{role} {step}: {text}"}
            for role in ("user", "assistant", "tool", "assistant")
        ],
        "scratch": {"attempt": step % 7, "score": (step * 37) % 101 / 100.0, "done": False},
        "tags": ["bench", f"shard-{step % 16}"],
    }
