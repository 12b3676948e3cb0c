"""The service opens its index through the one opener: the ``[index]`` settings name the
backend, and the retention they ask for is in force from the start."""

from __future__ import annotations

from pathlib import Path

from stream_dedup.core.config import DedupConfig
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.service.config import IndexConfig, RedisConfig
from stream_dedup.service.starting import open_configured_index
from tests.conftest import fresh_namespace

PARAMS = IndexParams.of(DedupConfig())


def test_a_rocksdb_index_opens_in_its_directory_with_the_retention_asked(tmp_path: Path) -> None:
    settings = IndexConfig(path=str(tmp_path / "index"), retention="2h", max_documents=9)
    index = open_configured_index(settings, PARAMS)
    try:
        assert index.location == str(tmp_path / "index")
        assert not index.shared
        assert index.retention == Retention(7200, 9)
    finally:
        index.close()


def test_a_redis_index_is_shared_with_the_retention_asked(redis_url: str) -> None:
    redis = RedisConfig(url=redis_url, namespace=fresh_namespace())
    settings = IndexConfig(backend="redis", retention="1d", redis=redis)
    index = open_configured_index(settings, PARAMS)
    try:
        assert index.shared
        assert redis.namespace in index.location
        assert index.retention == Retention(86400, 0)
    finally:
        index.close()
