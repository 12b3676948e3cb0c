"""Documents without a time of their own in the service: counted, warned about at most
once a minute; a zero retention in the settings is an error naming the key."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import CollectorRegistry

from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import DocumentFormat, MessageFormat
from stream_dedup.dedup import BatchStats, Deduplicator
from stream_dedup.errors import ConfigError
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.models import Document
from stream_dedup.service.config import IndexConfig
from stream_dedup.service.config_loading import load_config
from stream_dedup.service.events import Source
from stream_dedup.service.inputs import InputDecoder, MessageBatch
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ordering import RecordTime
from stream_dedup.service.time_warnings import TimeWarnings

Caplog = pytest.LogCaptureFixture
STAMP = 1_790_000_000_000


def batch(records: list[dict[str, object]], stamp: int | None = STAMP) -> MessageBatch:
    sources = [
        Source("in", 0, n, stamp, None, json.dumps(r).encode(), []) for n, r in enumerate(records)
    ]
    return MessageBatch([], sources)


def decoder(time_field: str) -> InputDecoder:
    fmt = MessageFormat(DocumentFormat(content_fields=("text",)))
    return InputDecoder(fmt, RecordTime(time_field))


def sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(f"stream_dedup_{name}_total") or 0.0


def test_a_missing_time_field_falls_back_to_the_message_timestamp_and_is_counted() -> None:
    records: list[dict[str, object]] = [
        {"id": "a", "text": "one", "ts": STAMP + 5000},
        {"id": "b", "text": "two"},
        {"id": "c", "text": "three", "ts": "not a time"},
        {"text": "no id: does not decode"},
    ]
    decoded = decoder("ts").decode(batch(records))
    assert [d.time for d in decoded.docs] == [STAMP + 5000, STAMP, STAMP]
    assert decoded.time_field_missing == 2 and len(decoded.undecodable) == 1
    assert decoder("").decode(batch(records)).time_field_missing == 0  # no field named
    untimed = decoder("").decode(batch(records[:2], stamp=None))
    assert [d.time for d in untimed.docs] == [None, None]


def test_a_field_missing_from_every_document_warns_at_most_once_a_minute(
    caplog: Caplog,
) -> None:
    registry = CollectorRegistry()
    now = [0.0]
    warner = TimeWarnings("ts", Metrics(registry), clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "stream_dedup.service")
    for second in (0.0, 10.0, 59.0, 61.0):
        now[0] = second
        warner.observe(3, 3, BatchStats())
    warner.observe(3, 1, BatchStats())  # some documents have it: by design, not warned
    logged = [r for r in caplog.records if "input.time_field 'ts'" in r.getMessage()]
    assert len(logged) == 2, "at 0 s and at 61 s; the batches between are counted"
    assert logged[1].fields["batches_not_logged"] == 2  # type: ignore[attr-defined]
    assert "check input.time_field" in logged[0].fields["action"]  # type: ignore[attr-defined]
    assert sample(registry, "time_field_missing") == 13


def test_a_window_over_documents_with_no_time_warns(caplog: Caplog) -> None:
    config = DedupConfig()
    index = open_index(None, IndexParams.of(config), retention=Retention(window=3600))
    dedup = Deduplicator(index, config)
    result = dedup.process([Document("a", "some text here"), Document("b", "other words")])
    assert result.stats.untimed == 2 and result.stats.window_without_time
    timed = dedup.process([Document("c", "a third text", STAMP), Document("d", "fourth one")])
    assert timed.stats.untimed == 1 and not timed.stats.window_without_time
    index.close()
    registry = CollectorRegistry()
    caplog.set_level(logging.WARNING, "stream_dedup.service")
    TimeWarnings("", Metrics(registry)).observe(2, 0, result.stats)
    (record,) = caplog.records
    assert "retention window in force" in record.getMessage()
    assert 'index.retention = "none"' in record.fields["action"]  # type: ignore[attr-defined]
    assert sample(registry, "untimed_documents") == 2


@pytest.mark.parametrize("zero", ["0", "0d", "0h"])
def test_a_zero_retention_in_the_settings_is_an_error(zero: str) -> None:
    with pytest.raises(ConfigError, match="window of zero") as info:
        IndexConfig(retention=zero)
    assert info.value.key == "index.retention"
    with pytest.raises(ConfigError, match="write 'none'"):
        load_config(None, environ={"STREAM_DEDUP_INDEX__RETENTION": zero})
    assert IndexConfig(retention="none").policy() == Retention()
