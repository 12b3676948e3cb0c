"""The service counts the documents a shared index's lease decides again
(``stream_dedup_redecided_documents_total``): those decided before the lease that another
instance wrote near meanwhile, in parts or, where parts cannot be told apart, whole."""

from __future__ import annotations

import json

from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from stream_dedup.decode import MessageFormat
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import Decider
from stream_dedup.service.inputs import Decoded, InputDecoder
from stream_dedup.service.metrics import Metrics
from tests.conftest import fresh_namespace
from tests.index.test_dedup import article, edit

METRIC = "stream_dedup_redecided_documents_total"


def decoded(docs: list[tuple[str, str]]) -> Decoded:
    msgs = [
        Message(
            topic="news",
            partition=0,
            offset=i,
            value=json.dumps({"id": doc_id, "text": text}).encode(),
            timestamp=(1, 1000 + i),
        )
        for i, (doc_id, text) in enumerate(docs)
    ]
    decoder = InputDecoder(MessageFormat())
    return decoder.decode(decoder.read(msgs))


def store(decider: Decider, batch: Decoded) -> None:
    """The shared strategy's step 1: settle (or decide) and store under the lease."""
    pre = decider.predecide(batch)
    index = decider.dedup.index
    with index.exclusive():
        decision = decider.settle(batch, None, pre)
        index.apply(decider.dedup.prepare(decision.result))
    decider.dedup.after_lease()


def test_documents_decided_again_in_the_lease_are_counted(redis_url: str) -> None:
    config = ServiceConfig()
    namespace = fresh_namespace()
    registry = CollectorRegistry()
    deciders = []
    for metrics in (Metrics(registry), Metrics(CollectorRegistry())):
        backend = RedisBackend(redis_url, namespace=namespace)
        dedup = Deduplicator(DedupIndex(backend, IndexParams.of(config.dedup)), config.dedup)
        deciders.append(Decider(config, dedup, metrics))
    first, second = deciders
    try:
        store(first, decoded([(f"o{i}", article(i)) for i in range(10)]))
        assert registry.get_sample_value(METRIC) == 0.0  # nothing written meanwhile

        # Another instance writes a near-duplicate of one pending document and an exact
        # repeat of another between the pre-decide and the lease: their parts (o107 with
        # its copy p107, and o121) are decided again.
        pending = decoded(
            [(f"o{i}", article(i)) for i in range(100, 140)] + [("p107", edit(article(107), 2, 9))]
        )
        pre = first.predecide(pending)
        assert pre is not None
        store(second, decoded([("near", edit(article(107), 3, 7)), ("same", article(121))]))
        with first.dedup.index.exclusive():
            decision = first.settle(pending, None, pre)
            first.dedup.index.apply(first.dedup.prepare(decision.result))
        first.dedup.after_lease()
        assert registry.get_sample_value(METRIC) == 3.0
        verdicts = {v.id: v.duplicate_of for v in decision.result.verdicts}
        assert (verdicts["o107"], verdicts["o121"]) == ("near", "same")

        # A replay of a pending id written meanwhile: the whole batch is decided again.
        later = decoded([("r1", article(500)), ("r2", article(501)), ("r3", article(502))])
        pre = first.predecide(later)
        assert pre is not None
        store(second, decoded([("r2", article(501))]))
        with first.dedup.index.exclusive():
            first.settle(later, None, pre)
        assert registry.get_sample_value(METRIC) == 6.0
    finally:
        for decider in deciders:
            decider.dedup.index.close()
