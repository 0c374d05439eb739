"""The command line imports only what the command and the URL's scheme need, so
that it starts quickly (the benchmarks' ``startup/*`` workloads measure the time;
this checks which modules get imported, never a time)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import statekeeper
from cli_helpers import run_cli

#: Runs the command line in this process and writes the names of every module
#: imported by the end to the file named by the first argument.
_RUN_AND_LIST = (
    "import sys\n"
    "out = sys.argv.pop(1)\n"
    "from statekeeper.cli.entry import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "import json; open(out, 'w').write(json.dumps(sorted(sys.modules)))\n"
)


def _modules(tmp_path: Path, *args: str, expect: int = 0) -> set[str]:
    listing = tmp_path / "modules.json"
    entry = [sys.executable, "-c", _RUN_AND_LIST, str(listing)]
    run_cli(*args, entry=entry, cwd=tmp_path, expect=None)
    return set(json.loads(listing.read_text()))


def _packages(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_help_imports_no_store_machinery(tmp_path: Path) -> None:
    modules = _modules(tmp_path, "--help")
    assert "statekeeper.cli.commands" in modules  # it did build the command list
    heavy = {"pydantic", "sqlalchemy", "rich", "asyncpg", "aiomysql", "asyncio"}
    assert not heavy & _packages(modules), sorted(heavy & _packages(modules))
    assert not {m for m in modules if m.startswith("statekeeper.backends")}
    assert "statekeeper.models" not in modules and "importlib.metadata" not in modules


def test_import_statekeeper_is_light_and_its_names_still_resolve(tmp_path: Path) -> None:
    code = (
        "import sys, statekeeper as sk\n"
        "heavy = {'pydantic', 'statekeeper.models', 'statekeeper._core.store'}\n"
        "light = not heavy & set(sys.modules)\n"
        "names = [getattr(sk, n) for n in sk.__all__]\n"
        "from statekeeper import open_store, errors, Checkpoint\n"
        "print(light, open_store is sk.open_store, errors.StoreNotFound.__name__,\n"
        "      set(sk.__all__) <= set(dir(sk)))\n"
    )
    result = run_cli(entry=[sys.executable, "-c", code], cwd=tmp_path)
    assert result.out.split() == ["True", "True", "StoreNotFound", "True"]


def test_latest_on_sqlite_imports_neither_server_machinery_nor_other_backends(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"

    async def seed() -> None:
        async with statekeeper.open_store(url) as store:
            for i in range(10):
                await store.save("job", {"i": i})

    asyncio.run(seed())
    modules = _modules(tmp_path, "latest", "job", "--url", url)
    assert "statekeeper.backends.sql.sqlite" in modules  # it did open the store
    assert "sqlalchemy.ext.asyncio" not in modules and "sqlalchemy.orm" not in modules
    assert not {m for m in modules if m.startswith("statekeeper.backends.file")}
    assert not {"statekeeper_redis", "aiomysql", "redis", "typer.testing"} & _packages(modules)
