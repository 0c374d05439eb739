"""What the run measured on: hardware, kernel, file system, servers and versions."""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = (
    "statekeeper",
    "statekeeper-redis",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "agent-framework-core",
    "sqlalchemy",
    "aiosqlite",
    "asyncpg",
    "redis",
    "psycopg",
    "psycopg-binary",
    "matplotlib",
)


def _first(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _mount_of(path: Path) -> str:
    best = ("", "?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, point, fstype, *_ = line.split()
            if str(path).startswith(point) and len(point) > len(best[0]):
                best = (point, fstype, device)
    except OSError:
        return "?"
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


def describe_machine(workdir: Path, postgres_url: str, redis_url: str) -> dict[str, Any]:
    mem_kib = _first("/proc/meminfo", "MemTotal")
    info: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)),
        "memory": f"{int(mem_kib.split()[0]) / 1024 / 1024:.1f} GiB" if mem_kib else "?",
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor() or "?",
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "filesystem": _mount_of(workdir.resolve()),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "packages": {},
    }
    for name in PACKAGES:
        try:
            info["packages"][name] = version(name)
        except PackageNotFoundError:
            info["packages"][name] = None
    info["postgresql"] = _postgres_version(postgres_url)
    info["redis_server"] = _redis_info(redis_url)
    return info


def _postgres_version(url: str) -> str:
    try:
        import psycopg

        dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            settings = []
            for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method"):
                row = conn.execute(f"SHOW {name}").fetchone()
                settings.append(f"{name}={row[0] if row else '?'}")
            return ", ".join(settings)
    except Exception as exc:  # reported, never fatal
        return f"unavailable ({type(exc).__name__})"


def _redis_info(url: str) -> str:
    try:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=3)
        try:
            server = client.info("server")
            persistence = client.info("persistence")
            appendfsync = client.config_get("appendfsync").get("appendfsync", "?")
        finally:
            client.close()
        aof = "on" if persistence.get("aof_enabled") else "off"
        return f"{server.get('redis_version')}, AOF {aof}, appendfsync={appendfsync}"
    except Exception as exc:
        return f"unavailable ({type(exc).__name__})"
