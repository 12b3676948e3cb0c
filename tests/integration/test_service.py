"""The service against a real broker and a real RocksDB index."""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from confluent_kafka import Consumer, TopicPartition

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult, Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.models import Document
from stream_dedup.service import gc_tuning
from stream_dedup.service.config import ServiceConfig

from .support import (
    ServiceThread,
    Topics,
    events,
    kijiji_documents,
    make_config,
    offline_reference,
    produce,
    produce_json,
    read_topic,
)

pytestmark = pytest.mark.broker


class FailingDeduplicator(Deduplicator):
    """The real core, except that deciding a document with id ``boom`` raises."""

    def __init__(self, index: DedupIndex, config: ServiceConfig) -> None:
        super().__init__(index, config.dedup)

    def decide(self, docs: Sequence[Document], sketched: Sketch | None = None) -> BatchResult:
        if any(d.id == "boom" for d in docs):
            raise RuntimeError("forced failure while deciding 'boom'")
        return super().decide(docs, sketched)


def event_validator() -> jsonschema.protocols.Validator:
    """A validator of the event schema, the schema itself checked once: ``jsonschema.validate``
    checks the schema again at every call (~0.1 s each, most of a 2,600-event test)."""
    text = resources.files("stream_dedup").joinpath("schemas/event.schema.json").read_text()
    schema = json.loads(text)
    kind = jsonschema.validators.validator_for(schema)
    kind.check_schema(schema)
    return kind(schema)


@pytest.mark.slow
def test_verdicts_through_kafka_equal_offline_command(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    docs = kijiji_documents()
    reference = offline_reference(docs, tmp_path)
    assert sum(v["verdict"] == "duplicate" for v in reference.values()) > 50
    produce_json(bootstrap, topics.input, docs)
    svc = ServiceThread(make_config(bootstrap, topics, tmp_path / "index")).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs))
    assert svc.stop() == 0

    uniques = read_topic(bootstrap, topics.unique, 1, timeout_s=10)
    duplicates = read_topic(bootstrap, topics.duplicates, 1, timeout_s=10)
    assert len(uniques) + len(duplicates) == len(docs)
    got = {e["id"]: e for e in events(uniques + duplicates)}
    assert len(got) == len(docs)
    validator = event_validator()
    for doc in docs:
        ev = got[doc["id"]]
        ref = reference[doc["id"]]
        fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
        assert {k: ev[k] for k in fields} == {k: ref[k] for k in fields}, doc["id"]
        assert ev["document"] == doc
        assert ev["topic"] == topics.input and ev["partition"] == 0
        validator.validate(ev)
    # events keep input order per output topic and carry the verdict in headers
    offsets = [e["offset"] for e in events(uniques)]
    assert offsets == sorted(offsets)
    for msg in duplicates[:20]:
        headers = dict(msg.headers() or [])
        body = json.loads(msg.value() or b"")
        assert headers["stream-dedup.verdict"] == b"duplicate"
        assert headers["stream-dedup.duplicate-of"] == body["duplicate_of"].encode()
        assert msg.key() == body["id"].encode()
    assert dict(uniques[0].headers() or [])["stream-dedup.verdict"] == b"unique"


def test_bad_input_goes_to_the_dead_letter_topic_and_the_stream_goes_on(
    bootstrap: str, topics: Topics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Collect on every pass of the loop: the caught exceptions of bad input leave cycles.
    monkeypatch.setattr(gc_tuning, "COLLECT_EVERY_S", 0.0)
    full_collections = gc.get_stats()[2]["collections"]
    good = [{"id": f"g{i}", "title": f"annuncio numero {i} " * 5} for i in range(4)]
    bad: list[tuple[str, bytes]] = [
        ("invalid_json", b'{"id": "x1", "title": '),
        ("missing_id", json.dumps({"title": "no id here"}).encode()),
        ("invalid_id", json.dumps({"id": ["a", "list"], "title": "bad id"}).encode()),
        ("missing_content", json.dumps({"id": "x4", "body": "wrong field"}).encode()),
        ("invalid_utf8", b'{"id": "x5", "title": "caf\xe9"}'),
        ("too_large", json.dumps({"id": "x6", "title": "y" * 5000}).encode()),
        # a valid document whose processing fails (see FailingDeduplicator)
        ("processing_error", json.dumps({"id": "boom", "title": "fails in the core"}).encode()),
    ]
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = []
    records.append((None, json.dumps(good[0]).encode(), None))
    for i, (reason, value) in enumerate(bad):
        records.append((f"k-{reason}".encode(), value, [("origin", f"crawler-{i}".encode())]))
        if i == 3:
            records.append((None, json.dumps(good[1]).encode(), None))
    records += [(None, json.dumps(d).encode(), None) for d in good[2:]]
    produce(bootstrap, topics.input, records)

    config = make_config(bootstrap, topics, tmp_path / "index", input={"max_message_bytes": 2000})
    svc = ServiceThread(config, FailingDeduplicator).start()
    svc.wait_for("stream_dedup_commits_total", 1)
    svc.wait_for("stream_dedup_messages_consumed_total", len(records))
    stats_index = svc.service.index
    dead = read_topic(bootstrap, topics.dlq, len(bad), timeout_s=20)
    assert len(dead) == len(bad)
    for msg, (reason, value) in zip(dead, bad, strict=True):
        headers = dict(msg.headers() or [])
        assert headers["__connect.errors.reason"] == reason.encode()
        assert headers["__connect.errors.topic"] == topics.input.encode()
        assert headers["__connect.errors.partition"] == b"0"
        assert int(headers["__connect.errors.offset"]) == next(
            i for i, r in enumerate(records) if r[1] == value
        )
        assert headers["__connect.errors.exception.message"]
        assert headers["__connect.errors.exception.class.name"]
        assert headers["origin"].startswith(b"crawler-")
        assert msg.value() == value
        assert msg.key() == f"k-{reason}".encode()
        assert svc.metric("stream_dedup_dead_letters_total", {"reason": reason}) == 1
    assert svc.metric("stream_dedup_dead_letters_total", {"reason": "not_an_object"}) == 0
    good_events = read_topic(bootstrap, topics.unique, len(good), timeout_s=20)
    assert sorted(e["id"] for e in events(good_events)) == [d["id"] for d in good]
    # every offset, dead letters included, is committed to the index
    svc.wait_for("stream_dedup_commits_total", 1)
    assert stats_index.offsets() == {(topics.input, 0): len(records)}
    # the loop runs without automatic collection, and collects between batches instead
    assert not gc.isenabled()
    assert gc.get_stats()[2]["collections"] > full_collections
    assert svc.stop() == 0
    assert gc.isenabled()


def test_restart_after_clean_stop_resumes_without_reprocessing(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    docs = kijiji_documents(600)
    config = make_config(bootstrap, topics, tmp_path / "index")
    produce_json(bootstrap, topics.input, docs[:400])
    first = ServiceThread(config).start()
    first.wait_for("stream_dedup_messages_consumed_total", 400)
    assert first.stop() == 0
    # The offsets reached Kafka too (committed without waiting), for lag tools.
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group})
    try:
        [committed] = probe.committed([TopicPartition(topics.input, 0)], timeout=10)
    finally:
        probe.close()
    assert committed.offset == 400

    produce_json(bootstrap, topics.input, docs[400:])
    second = ServiceThread(config).start()
    second.wait_for("stream_dedup_messages_consumed_total", 200)
    assert second.metric("stream_dedup_replayed_documents_total") == 0
    assert second.stop() == 0
    assert second.metric("stream_dedup_messages_consumed_total") == 200

    out = read_topic(bootstrap, topics.unique, 1, timeout_s=10) + read_topic(
        bootstrap, topics.duplicates, 1, timeout_s=10
    )
    ids = [e["id"] for e in events(out)]
    assert sorted(ids, key=int) == [d["id"] for d in docs]  # each exactly once
