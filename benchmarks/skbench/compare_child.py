"""One side of ``compare.py``: a child process holding one workload of one revision.

Started as ``python -m skbench.compare_child --expect DIR`` with that revision's
trees first on ``PYTHONPATH`` (:meth:`skbench.compare_source.Side.env`); it refuses
to run if ``statekeeper`` was imported from anywhere but ``DIR``. The parent then
drives it with one JSON command a line on stdin, and it answers each with one JSON
line on its real stdout (anything else printed goes to stderr):

- ``{"cmd": "open", "workload": "file", "size": 10000, "workdir": ..., "postgres_url": ...}``:
  build the store and check every workload once; answers the build's time and the
  wrong answers found (``problems``, op -> what is wrong);
- ``{"cmd": "round", "reps": {op: n}, "seed": k}``: ``n`` calls of each op, the
  ops in an order shuffled by ``seed``, the collector off; answers the raw
  per-call nanoseconds (``samples``, op -> list) and ``errors`` (op -> message);
- ``{"cmd": "calibrate", "seconds": s}``: calls of each op for up to ``s`` seconds
  (at most 50), answered like a round; the parent sizes the rounds from these;
- ``{"cmd": "close"}``: close the store, answer, and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from skbench.compare_workloads import CodecWorkload, Op, StoreWorkload


def _replies() -> TextIO:
    """The protocol's channel: the real stdout; fd 1 itself now points at stderr,
    so nothing a library prints can corrupt an answer."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


class Child:
    def __init__(self) -> None:
        self.workload: StoreWorkload | CodecWorkload | None = None
        self.ops: dict[str, Op] = {}
        self.index: dict[str, int] = {}

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg["cmd"]
        if cmd == "open":
            return await self.open(msg)
        if cmd == "calibrate":
            return await self.calibrate(float(msg["seconds"]))
        if cmd == "round":
            return await self.round(msg["reps"], int(msg["seed"]))
        if cmd == "close":
            if self.workload is not None:
                await self.workload.close()
            return {"closed": True}
        raise ValueError(f"unknown command {cmd!r}")

    async def open(self, msg: dict[str, Any]) -> dict[str, Any]:
        name = msg["workload"]
        if name == "codec":
            self.workload = CodecWorkload()
        else:
            self.workload = StoreWorkload(
                name, Path(msg["workdir"]), int(msg["size"]), msg.get("postgres_url", "")
            )
        await self.workload.open()
        started = time.perf_counter()
        saved = await self.workload.build()
        built = time.perf_counter() - started
        problems = await self.workload.check()
        self.ops = {k: v for k, v in (await self.workload.prepare()).items() if k not in problems}
        self.index = dict.fromkeys(self.ops, 0)
        # the build's objects live for the whole run: out of the collector's way
        gc.collect()
        gc.freeze()
        reply: dict[str, Any] = {
            "saved": saved,
            "build_seconds": built,
            "problems": problems,
            "ops": list(self.ops),
        }
        if isinstance(self.workload, CodecWorkload):
            reply["encoded_bytes"] = self.workload.sizes()
        return reply

    async def _calls(self, name: str, count: int, until: float | None = None) -> list[int]:
        op, start, out = self.ops[name], self.index[name], []
        clock = time.perf_counter_ns
        for k in range(count):
            t0 = clock()
            await op(start + k)
            out.append(clock() - t0)
            if until is not None and time.perf_counter() > until:
                break
        self.index[name] = start + len(out)
        return out

    async def _run(self, plan: list[tuple[str, int, float | None]]) -> dict[str, Any]:
        samples: dict[str, list[int]] = {}
        errors: dict[str, str] = {}
        # what the last calls left: collected, and the survivors frozen, so that the
        # next collection has only the newest objects to look at
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            for name, count, seconds in plan:
                until = None if seconds is None else time.perf_counter() + seconds
                try:
                    samples[name] = await self._calls(name, count, until)
                except Exception as exc:  # reported by the parent, never fatal here
                    errors[name] = f"{type(exc).__name__}: {exc}"
                    del self.ops[name]
        finally:
            gc.enable()
        return {"samples": samples, "errors": errors}

    async def calibrate(self, seconds: float) -> dict[str, Any]:
        return await self._run([(name, 50, seconds) for name in self.ops])

    async def round(self, reps: dict[str, int], seed: int) -> dict[str, Any]:
        names = [n for n in reps if n in self.ops]
        random.Random(seed).shuffle(names)
        return await self._run([(name, int(reps[name]), None) for name in names])


def _check_import(expect: Path) -> str:
    import statekeeper

    where = Path(statekeeper.__file__).resolve()
    if expect.resolve() not in where.parents:
        raise SystemExit(f"statekeeper was imported from {where}, not from {expect}")
    return str(where.parent)


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect", type=Path, required=True)
    args = parser.parse_args(argv)
    out = _replies()
    where = _check_import(args.expect)
    out.write(json.dumps({"ready": where, "pid": os.getpid()}) + "\n")
    out.flush()
    child = Child()
    # commands arrive through the event loop's own poll: one wake-up per command, and
    # the loop stays free for the store's own callbacks while the other side runs
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        msg = json.loads(line)
        try:
            reply = await child.handle(msg)
        except Exception as exc:  # the parent reports it and stops this side
            reply = {"failed": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if msg.get("cmd") == "close":
            return


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
