"""Deciding a batch: a document that fails alone is dead-lettered, a broken index stops.

Over a real RocksDB index on disk. An unreadable index is a closed database handle: every
read then fails inside RocksDB as an I/O failure would, through the same code path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult, Deduplicator
from stream_dedup.errors import DecodeError, IndexIOError, RecordRefusedError
from stream_dedup.index import DedupIndex, RocksBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.config_loading import build_config
from stream_dedup.service.decide import Decider
from stream_dedup.service.events import DLQ_REASON, Source
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.refusals import HEADER_VALUE_DROPPED

BOOM = "boom"


class Failing(Deduplicator):
    """The real core, except that deciding a batch holding ``boom`` raises ``error``."""

    def __init__(self, index: DedupIndex, config: ServiceConfig, error: BaseException) -> None:
        super().__init__(index, config.dedup)
        self.error = error

    def decide(self, docs: Sequence[Document], sketched: Sketch | None = None) -> BatchResult:
        if any(d.id == BOOM for d in docs):
            raise self.error
        return super().decide(docs, sketched)


@pytest.fixture
def config(tmp_path: Path) -> ServiceConfig:
    return build_config([{"input": {"topics": ["in"]}, "index": {"path": str(tmp_path / "i")}}])


@pytest.fixture
def backend(config: ServiceConfig) -> Iterator[RocksBackend]:
    assert config.index.path is not None
    backend = RocksBackend(config.index.path)
    yield backend
    with contextlib.suppress(Exception):  # a test closed the database under it
        backend.close()


@pytest.fixture
def index(backend: RocksBackend, config: ServiceConfig) -> DedupIndex:
    return DedupIndex(backend, IndexParams.of(config.dedup))


def decoded(docs: list[Document], first_offset: int = 0) -> Decoded:
    """A decoded batch of ``docs``, as messages of topic ``in`` from ``first_offset`` on."""
    sources = [
        Source("in", 0, first_offset + n, None, d.id.encode(), json.dumps(d.content).encode(), [])
        for n, d in enumerate(docs)
    ]
    return Decoded([], docs, sources, [])


def dead_letters(registry: CollectorRegistry) -> float:
    """Dead letters counted so far, of every reason."""
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "stream_dedup_dead_letters"
        for sample in metric.samples
        if sample.name == "stream_dedup_dead_letters_total"
    )


def indexed(index: DedupIndex, config: ServiceConfig, docs: list[Document]) -> None:
    """``docs`` decided and committed: later batches read their records and buckets."""
    dedup = Deduplicator(index, config.dedup)
    dedup.commit(dedup.decide(docs))


def test_a_document_failing_alone_is_dead_lettered_and_the_rest_decided(
    config: ServiceConfig, index: DedupIndex, kijiji_ads: list[tuple[str, str]]
) -> None:
    docs = [Document(i, c) for i, c in kijiji_ads[:40]]
    docs.insert(7, Document(BOOM, "an ordinary text whose deciding fails"))
    registry = CollectorRegistry()
    decider = Decider(config, Failing(index, config, RuntimeError("a bug")), Metrics(registry))

    out = decider.build(decoded(docs))

    assert [v.id for v in out.result.verdicts] == [d.id for d in docs if d.id != BOOM]
    dead = [r for r in out.records if r.topic == config.dlq_topic]
    assert len(dead) == 1 and dead[0].key == BOOM.encode()
    assert dict(dead[0].headers)[DLQ_REASON] == b"processing_error"
    assert dead_letters(registry) == 1


def test_deciding_counts_nothing_and_the_records_are_those_of_a_build(
    config: ServiceConfig, index: DedupIndex, kijiji_ads: list[tuple[str, str]]
) -> None:
    """The shared index's lease holds only :meth:`Decider.decide`: it builds no event and
    counts no dead letter; :meth:`Decider.records` after it gives what a build gives."""
    docs = [Document(i, c) for i, c in kijiji_ads[:40]]
    docs.insert(3, Document(BOOM, "an ordinary text whose deciding fails"))
    registry = CollectorRegistry()
    decider = Decider(config, Failing(index, config, RuntimeError("a bug")), Metrics(registry))

    batch = decoded(docs)
    decision = decider.decide(batch)
    assert [i for i, _ in decision.failed] == [3]
    assert dead_letters(registry) == 0  # nothing counted while the lease would be held
    out = decider.records(batch, decision)
    assert dead_letters(registry) == 1
    built = decider.build(batch)  # decided again (nothing was stored): the same records
    assert [(r.topic, r.key) for r in out.records] == [(r.topic, r.key) for r in built.records]
    assert len(out.records) == len(docs) and out.result is decision.result


def test_an_unreadable_index_stops_the_batch_without_dead_letters(
    config: ServiceConfig,
    backend: RocksBackend,
    index: DedupIndex,
    kijiji_ads: list[tuple[str, str]],
) -> None:
    docs = [Document(i, c) for i, c in kijiji_ads]
    indexed(index, config, docs[:1500])
    registry = CollectorRegistry()
    decider = Decider(config, Deduplicator(index, config.dedup), Metrics(registry))
    backend.db.close()  # every read fails from here on, inside RocksDB

    with pytest.raises(IndexIOError, match=str(backend.location)):
        decider.build(decoded(docs[1500:], 1500))
    assert dead_letters(registry) == 0


def test_an_unreadable_index_is_not_blamed_on_the_documents_of_a_failed_batch(
    config: ServiceConfig,
    backend: RocksBackend,
    index: DedupIndex,
    kijiji_ads: list[tuple[str, str]],
) -> None:
    """The batch fails for one document's sake; deciding the documents one by one then
    reads the broken index, which must stop the batch, not dead-letter each document."""
    docs = [Document(i, c) for i, c in kijiji_ads]
    indexed(index, config, docs[:1500])
    registry = CollectorRegistry()
    failing = Failing(index, config, RuntimeError("a bug"))
    decider = Decider(config, failing, Metrics(registry))
    backend.db.close()

    with pytest.raises(IndexIOError):
        decider.build(decoded([*docs[1500:1600], Document(BOOM, "fails alone")], 1500))
    assert dead_letters(registry) == 0


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), MemoryError()])
def test_environment_errors_propagate_instead_of_dead_lettering(
    config: ServiceConfig,
    index: DedupIndex,
    kijiji_ads: list[tuple[str, str]],
    error: BaseException,
) -> None:
    docs = [Document(i, c) for i, c in kijiji_ads[:20]] + [Document(BOOM, "a text")]
    registry = CollectorRegistry()
    decider = Decider(config, Failing(index, config, error), Metrics(registry))

    with pytest.raises(type(error)):
        decider.build(decoded(docs))
    assert dead_letters(registry) == 0


def said(record: logging.LogRecord) -> dict[str, object]:
    """The structured fields of a log record (``extra=fields(...)``)."""
    found: dict[str, object] = record.__dict__["fields"]
    return found


def test_dead_letters_are_logged_once_per_reason_a_while_and_counted_each(
    config: ServiceConfig, index: DedupIndex, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    decider = Decider(config, Deduplicator(index, config.dedup), Metrics(registry), 0.2)
    source = Source("in", 0, 0, None, b"k", b"{}", [])
    bad = DecodeError("missing_id", "no 'id' field")
    with caplog.at_level(logging.WARNING, logger="stream_dedup.service"):
        for _ in range(50):
            decider.dead_letter(source, "missing_id", bad, "decode")
        decider.dead_letter(source, "too_large", bad, "decode")
        first = [(said(r)["reason"], said(r)["suppressed"]) for r in caplog.records]
        assert first == [("missing_id", 0), ("too_large", 0)]
        time.sleep(0.25)  # the window is over: the next line says how many were left out
        decider.dead_letter(source, "missing_id", bad, "decode")
    later = caplog.records[-1]
    assert later.getMessage() == "message dead-lettered"
    assert said(later)["suppressed"] == 49
    assert len(caplog.records) == 3
    assert dead_letters(registry) == 52  # the metric counts every one


def test_a_refused_record_is_replaced_step_by_step_down_to_an_error(
    config: ServiceConfig, index: DedupIndex, kijiji_ads: list[tuple[str, str]]
) -> None:
    """Event -> its message's dead letter -> that dead letter without its value -> a
    RecordRefusedError: nothing is dropped without the service stopping."""
    docs = [Document(i, c) for i, c in kijiji_ads[:3]]
    registry = CollectorRegistry()
    decider = Decider(config, Deduplicator(index, config.dedup), Metrics(registry))
    out = decider.build(decoded(docs))
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")

    dead = out.refused(out.records[1], too_large)
    assert (dead.topic, dead.key, dead.value) == (
        config.dlq_topic,
        docs[1].id.encode(),
        json.dumps(docs[1].content).encode(),
    )
    assert dict(dead.headers)[DLQ_REASON] == b"refused"
    bare = out.refused(dead, too_large)
    assert bare.value is None and bare.key == docs[1].id.encode()
    assert dict(bare.headers)[HEADER_VALUE_DROPPED] == (
        f"{len(dead.value or b'')} bytes dropped: Broker: Message size too large"
    )
    with pytest.raises(RecordRefusedError, match=config.dlq_topic):
        out.refused(bare, too_large)
    refused = {
        k: registry.get_sample_value("stream_dedup_refused_records_total", {"kind": k})
        for k in ("event", "dead_letter")
    }
    assert refused == {"event": 1, "dead_letter": 2}
    assert registry.get_sample_value("stream_dedup_dead_letters_total", {"reason": "refused"}) == 1
