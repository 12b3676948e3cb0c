"""The one opener: every backend from one call, retention in force from opening, the
clear error for an absent index, and no backend's client loaded before it is asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.errors import ConfigError, IndexMismatchError, IndexStoreError
from stream_dedup.index.opener import (
    Location,
    RedisSettings,
    open_index,
    open_or_create,
    open_rocks,
)
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import NO_RETENTION, Retention, RetentionChange
from tests.conftest import fresh_namespace

ROOT = Path(__file__).resolve().parents[2]
PARAMS = IndexParams.of(DedupConfig())


@pytest.fixture
def where(backend_kind: str, tmp_path: Path, redis_backend_url: str | None) -> Location:
    """A location of ``backend_kind`` that holds no index yet."""
    if redis_backend_url is not None:
        return RedisSettings(redis_backend_url, namespace=fresh_namespace())
    return None if backend_kind == "memory" else tmp_path / "index"


def test_every_backend_opens_with_the_retention_given_at_opening(where: Location) -> None:
    asked = Retention(3600, 50)
    index = open_index(where, PARAMS, retention=asked)
    try:
        assert index.retention == asked
        assert index.stats().retention == asked
        index.commit({}, {"documents": 1})  # the retention is stored with the first batch
        if where is not None:  # a memory index is gone once closed
            index.close()
            index = open_index(where, None)
            assert index.retention == asked
            assert index.params == PARAMS
    finally:
        index.close()


def test_a_retention_change_is_made_over_the_stored_one(where: Location) -> None:
    if where is None:
        pytest.skip("a memory index stores nothing across openings")
    index = open_index(where, PARAMS, retention=Retention(3600, 50))
    index.commit({}, {"documents": 1})
    index.close()
    index = open_index(where, None, retention=RetentionChange.of("2h", None))
    try:
        assert index.retention == Retention(7200, 50)
    finally:
        index.close()


def test_the_retention_cannot_be_assigned_after_opening() -> None:
    index = open_index(None, PARAMS)
    try:
        assert index.retention == NO_RETENTION
        with pytest.raises(AttributeError):
            index.retention = Retention(60)  # type: ignore[misc]
    finally:
        index.close()


def test_a_bad_retention_option_fails_before_anything_is_opened() -> None:
    with pytest.raises(ConfigError, match="--retention"):
        RetentionChange.of("soon", None, "--retention")
    with pytest.raises(ConfigError, match="max_documents"):
        RetentionChange.of(None, -1)


@pytest.mark.parametrize("how", ["without parameters", "read_only"])
def test_a_missing_rocksdb_index_is_a_clear_error_and_nothing_is_created(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "nowhere"
    with pytest.raises(IndexStoreError, match="holds no index: create one with `stream-dedup"):
        if how == "without parameters":
            open_index(path, None)
        else:
            open_rocks(path, read_only=True)
    assert not path.exists()


def test_an_index_on_redis_without_metadata_is_refused(redis_url: str) -> None:
    with pytest.raises(IndexStoreError, match="not a stream-dedup index"):
        open_index(RedisSettings(redis_url, namespace=fresh_namespace()), None)


def test_open_or_create_hands_the_stored_configuration_to_the_choice(tmp_path: Path) -> None:
    path = tmp_path / "index"
    seen: list[DedupConfig | None] = []

    def choose(stored: DedupConfig | None) -> DedupConfig:
        seen.append(stored)
        return stored if stored is not None else DedupConfig(threshold=0.7)

    index, config = open_or_create(path, choose)
    index.close()
    again, config_again = open_or_create(path, choose)
    again.close()
    assert seen[0] is None and seen[1] is not None and seen[1].threshold == 0.7
    assert IndexParams.of(config_again) == IndexParams.of(config)

    with pytest.raises(IndexMismatchError, match="threshold"):
        open_or_create(path, lambda stored: DedupConfig(threshold=0.9))
    open_index(path, None).close()  # the refused opening let the index go


def test_open_or_create_creates_nothing_when_the_choice_fails(tmp_path: Path) -> None:
    def refuse(stored: DedupConfig | None) -> DedupConfig:
        raise ConfigError("threshold", "refused")

    with pytest.raises(ConfigError):
        open_or_create(tmp_path / "index", refuse)
    assert not (tmp_path / "index").exists()


def _loaded_after(statement: str) -> list[str]:
    """The backends' client libraries loaded after ``statement``, in a fresh interpreter."""
    probe = (
        f"import sys\n{statement}\nimport json\n"
        "print(json.dumps([m for m in ('rocksdict', 'redis') if m in sys.modules]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    loaded: list[str] = json.loads(run.stdout.strip().splitlines()[-1])
    return loaded


def test_the_opener_loads_a_backend_only_when_it_is_asked_for(tmp_path: Path) -> None:
    opener = "from stream_dedup.index.opener import open_index"
    memory = (
        "from stream_dedup.index import IndexParams\n"
        "from stream_dedup.core.config import DedupConfig\n"
        "open_index(None, IndexParams.of(DedupConfig())).close()"
    )
    rocks = f"open_index({str(tmp_path / 'idx')!r}, IndexParams.of(DedupConfig())).close()"
    assert _loaded_after(opener) == []
    assert _loaded_after("import stream_dedup.index") == []
    assert _loaded_after(f"{opener}\n{memory}") == []
    assert _loaded_after(f"{opener}\n{memory}\n{rocks}") == ["rocksdict"]
