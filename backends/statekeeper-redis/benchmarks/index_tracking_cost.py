"""What the index tracking costs: median wall time of one ``save`` and one
``get_latest``, before and after, side by side in one run.

    uv run python backends/statekeeper-redis/benchmarks/index_tracking_cost.py \\
        [--url redis://127.0.0.1:6379/0 | --scratch] [--before REV] [--rounds 7] [--calls 300]

"Before" is the plugin's source at ``REV`` (default: the commit before tracking
was added), taken with ``git archive`` into a temporary directory; "after" is the
working tree. Each runs in its own worker process (the source first on
``PYTHONPATH``), with its own key prefix and a stream of 1,000 checkpoints. The
two workers take turns, one round each, so that load from other processes on the
machine hits both alike. A round times ``--calls`` saves to the stream and then
``--calls`` ``get_latest`` calls on it, each call on its own; the figure is the
median over every call of every round. Everything the workers created is deleted
at the end (SCAN + UNLINK of their prefixes).

With ``--scratch`` each worker gets its own ``redis-server`` (started on a free
loopback port, nothing persisted, stopped at the end), so the server's own
``INFO commandstats`` can say how long the scripts ran: the ``server µs`` columns
are the server's mean ``EVALSHA`` time per call in a round (median and least of
the rounds), which the wall time of a call on a loaded machine hides in its noise,
and the ``commands`` rows count the Redis commands the scripts ran per call (the
same count on any machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIST = HERE.parent
REPO = DIST.parent.parent
#: The commit before the tracking (count in P meta, P h) was added.
BEFORE = "d2797a5"


def extract(rev: str, into: Path) -> Path:
    """The plugin's ``src`` directory at ``rev``, unpacked under ``into``."""
    rel = DIST.relative_to(REPO) / "src"
    blob = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, str(rel)],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into / rel


async def _server_stats(store: object) -> tuple[float, int]:
    """Server µs spent in EVALSHA, and the commands the scripts ran, since the last
    reset; then reset the counters (the scratch server serves this worker only)."""
    client = store.client  # type: ignore[attr-defined]
    stats = await client.info("commandstats")
    usec = float(stats.get("cmdstat_evalsha", {}).get("usec", 0))
    inner = sum(
        int(v.get("calls", 0))
        for k, v in stats.items()
        if k not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config|resetstat")
    )
    await client.config_resetstat()
    return usec, inner


async def worker(url: str, prefix: str, fill: int, server_stats: bool) -> None:
    """Serve rounds: read a number of calls per line on stdin, answer a JSON line
    of per-call seconds ``{"save": [...], "get_latest": [...]}`` (and, on a server
    of its own, the server's µs per call, ``save_server`` and ``get_latest_server``)."""
    from statekeeper_redis import RedisCheckpointStore

    async with RedisCheckpointStore(url, key_prefix=prefix, allow_unsafe_durability=True) as store:
        for i in range(fill):
            await store.save("bench", {"step": i, "pad": "x" * 200})
        for line in sys.stdin:
            calls = int(line)
            saves, reads = [], []
            out: dict[str, list[float]] = {}
            if server_stats:
                await _server_stats(store)
            for i in range(calls):
                t0 = time.perf_counter()
                await store.save("bench", {"step": i, "pad": "x" * 200})
                saves.append(time.perf_counter() - t0)
            if server_stats:
                usec, inner = await _server_stats(store)
                out["save_server"], out["save_commands"] = [usec / calls], [inner / calls]
            for _ in range(calls):
                t0 = time.perf_counter()
                await store.get_latest("bench")
                reads.append(time.perf_counter() - t0)
            if server_stats:
                usec, inner = await _server_stats(store)
                out["get_latest_server"] = [usec / calls]
                out["get_latest_commands"] = [inner / calls]
            print(json.dumps({"save": saves, "get_latest": reads, **out}), flush=True)
        source = sys.modules["statekeeper_redis"].__file__
        print(json.dumps({"source": source}), flush=True)


def scratch_server(workdir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A redis-server of this run's own on a free loopback port (nothing persisted)."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--scratch needs redis-server on PATH")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    workdir.mkdir()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.025)
    finally:
        client.close()
    return f"redis://127.0.0.1:{port}/0", proc


def drop(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match="{" + prefix + "}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.unlink(*keys[i : i + 500])
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--fill", type=int, default=1000)
    parser.add_argument("--scratch", action="store_true", help="a redis-server per worker")
    parser.add_argument("--worker", nargs=2, metavar=("PREFIX", "FILL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.url, args.worker[0], int(args.worker[1]), args.scratch))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"before": extract(args.before, Path(tmp)), "after": DIST / "src"}
        procs: dict[str, subprocess.Popen[str]] = {}
        servers: list[subprocess.Popen[bytes]] = []
        urls = dict.fromkeys(sources, args.url)
        prefixes = {name: f"sk-bench-{name}-{secrets.token_hex(4)}" for name in sources}
        timings: dict[str, dict[str, list[float]]] = {name: {} for name in sources}
        try:
            for name, src in sources.items():
                if args.scratch:
                    urls[name], server = scratch_server(Path(tmp) / f"redis-{name}")
                    servers.append(server)
                env = {
                    **os.environ,
                    "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                }
                procs[name] = subprocess.Popen(
                    [sys.executable, __file__, "--url", urls[name],
                     "--worker", prefixes[name], str(args.fill)]
                    + (["--scratch"] if args.scratch else []),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                )  # fmt: skip
            for _ in range(args.rounds):
                for name, proc in procs.items():
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{args.calls}\n")
                    proc.stdin.flush()
                    got = json.loads(proc.stdout.readline())
                    for op, values in got.items():
                        timings[name].setdefault(op, []).extend(values)
            loaded = {}
            for name, proc in procs.items():
                out, _err = proc.communicate(timeout=60)
                loaded[name] = json.loads(out.strip().splitlines()[-1])["source"]
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
            for name, prefix in prefixes.items():
                drop(urls[name], prefix)
            for server in servers:
                server.terminate()
                server.wait(timeout=10)
    print(f"before: {args.before} ({loaded['before']})")
    print(f"after:  working tree ({loaded['after']})")
    print(f"{args.rounds} rounds x {args.calls} calls each, stream of {args.fill}+ checkpoints")
    print(f"{'median µs':<12}{'before':>10}{'after':>10}{'added':>10}")
    for op in ("save", "get_latest"):
        b = statistics.median(timings["before"][op]) * 1e6
        a = statistics.median(timings["after"][op]) * 1e6
        print(f"{op:<12}{b:>10.1f}{a:>10.1f}{a - b:>+10.1f}")
    if args.scratch:
        # per round: the server's mean EVALSHA time per call; the median and the
        # least of the rounds (the least is the one other load disturbed least)
        print(f"{'server µs':<12}{'before':>10}{'after':>10}{'added':>10}  median | least round")
        for op in ("save", "get_latest"):
            b, a = timings["before"][op + "_server"], timings["after"][op + "_server"]
            mb, ma, lb, la = statistics.median(b), statistics.median(a), min(b), min(a)
            print(
                f"{op:<12}{mb:>10.1f}{ma:>10.1f}{ma - mb:>+10.1f}"
                f"  | {lb:.1f} {la:.1f} {la - lb:+.1f}"
            )
        print(
            f"{'commands':<12}{'before':>10}{'after':>10}{'added':>10}  run by the script, per call"
        )
        for op in ("save", "get_latest"):
            b = statistics.median(timings["before"][op + "_commands"])
            a = statistics.median(timings["after"][op + "_commands"])
            print(f"{op:<12}{b:>10.1f}{a:>10.1f}{a - b:>+10.1f}")


if __name__ == "__main__":
    main()
