from __future__ import annotations

import pytest

import statekeeper as sk
from statekeeper.backends.memory import MemoryCheckpointStore
from statekeeper.errors import BackendNotFound, InvalidOptions, InvalidURL


def test_builtin_schemes_are_available_lazily() -> None:
    backends = sk.available_backends()
    for scheme in ("memory", "file", "sqlite", "postgresql", "mysql"):
        assert scheme in backends
    assert backends["memory"] == "statekeeper.backends.memory:MemoryCheckpointStore"


def test_each_sql_scheme_names_its_dialects_class() -> None:
    """Opening one dialect imports that dialect's package only."""
    backends = sk.available_backends()
    assert backends["sqlite"] == "statekeeper.backends.sql:SqliteCheckpointStore"
    postgres = "statekeeper.backends.sql.postgres:PostgresCheckpointStore"
    assert backends["postgresql"] == backends["postgres"] == postgres
    mysql = "statekeeper.backends.sql.mysql:MysqlCheckpointStore"
    assert backends["mysql"] == backends["mariadb"] == mysql


def test_unknown_scheme_lists_installed_schemes_and_a_hint() -> None:
    with pytest.raises(BackendNotFound) as info:
        sk.open_store("nosuch://x")
    assert isinstance(info.value, LookupError)
    assert "memory" in str(info.value) and "sqlite" in str(info.value)


def test_register_backend_in_code_by_class_and_by_string() -> None:
    class Custom(MemoryCheckpointStore):
        pass

    sk.register_backend("custom-test", Custom)
    assert isinstance(sk.open_store("custom-test://"), Custom)
    sk.register_backend("custom-test2", "statekeeper.backends.memory:MemoryCheckpointStore")
    assert type(sk.open_store("custom-test2://")) is MemoryCheckpointStore
    assert "custom-test" in sk.available_backends()


def test_register_backend_target_must_be_a_store_class() -> None:
    sk.register_backend("custom-bad", "statekeeper.errors:StatekeeperError")
    with pytest.raises(BackendNotFound, match="not a BaseCheckpointStore"):
        sk.open_store("custom-bad://")


def test_unknown_option_is_an_error_from_kwargs_and_from_url() -> None:
    with pytest.raises(InvalidOptions, match="nonsense"):
        sk.open_store("memory://", nonsense=1)
    with pytest.raises(InvalidOptions, match="nonsense"):
        sk.open_store("memory://?nonsense=1")


def test_options_are_validated_at_open_store_time() -> None:
    with pytest.raises(InvalidOptions, match="durability"):
        sk.open_store("memory://", durability="sometimes")
    store = sk.open_store("memory://?max_depth=7&durability=fast")
    assert store.options.max_depth == 7 and store.options.durability == "fast"


def test_options_are_frozen() -> None:
    store = sk.open_store("memory://")
    with pytest.raises(ValueError, match="frozen"):
        store.options.durability = "fast"  # type: ignore[misc]


def test_same_option_in_url_and_kwargs_is_an_error() -> None:
    with pytest.raises(InvalidOptions, match="both"):
        sk.open_store("memory://?max_depth=7", max_depth=8)


def test_config_mapping_form() -> None:
    store = sk.open_store({"url": "memory://", "durability": "fast"})
    assert store.options.durability == "fast"


def test_statekeeper_url_is_read_when_no_url_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEKEEPER_URL", "memory://")
    assert isinstance(sk.open_store(), MemoryCheckpointStore)
    monkeypatch.delenv("STATEKEEPER_URL")
    with pytest.raises(InvalidURL, match="STATEKEEPER_URL"):
        sk.open_store()


def test_allowed_types_string_must_name_a_real_class() -> None:
    with pytest.raises(InvalidOptions):
        sk.open_store("memory://", allowed_types=["no.such.module:Thing"])


def test_unknown_option_error_lists_options_as_users_spell_them() -> None:
    with pytest.raises(InvalidOptions) as info:
        sk.open_store("postgresql://u@h/db", bogus=1)
    message = str(info.value)
    assert "schema" in message and "db_schema" not in message
