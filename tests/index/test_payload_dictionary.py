"""Payloads compressed with a dictionary the index trains (index format 6): verdicts as
without one, far fewer bytes, and every record readable by a process that never saw the
dictionary trained."""

from __future__ import annotations

import threading
import time

import pytest

from stream_dedup.core import payload_dictionary
from stream_dedup.core.payload import ZSTD_DICTIONARY, ZSTD_MAGICLESS, decode_text
from stream_dedup.core.payload_dictionary import dictionary_id
from stream_dedup.dedup import Deduplicator, dictionary
from stream_dedup.errors import IndexCorruptError
from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.records import decode_doc
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.store import DedupIndex
from stream_dedup.models import Document
from tests.conftest import BackendFactory, fresh_namespace
from tests.index.test_payload_format import CONFIG, FORMAT_2_DIGEST, decide, digest, stream


def payload_sizes(backend_records: dict[bytes, bytes]) -> dict[int, list[int]]:
    """Payload bytes of the document records by codec."""
    out: dict[int, list[int]] = {}
    for raw in backend_records.values():
        record = decode_doc(raw)
        assert record.text
        out.setdefault(record.payload[0], []).append(len(record.payload))
    return out


def test_a_trained_dictionary_keeps_verdicts_and_cuts_payloads(
    backend_factory: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = backend_factory()
    index = DedupIndex(backend, IndexParams.of(CONFIG))
    dedup = Deduplicator(index, CONFIG)
    assert dedup.payload_dictionary.dictionary is None  # a new index has none
    dedup.payload_dictionary.train_documents = 1000
    docs = stream()
    verdicts = decide(dedup, docs[:1000])
    dedup.payload_dictionary.wait()  # a shared index trains it on a thread of its own
    verdicts += decide(dedup, docs[1000:])
    assert digest(verdicts) == FORMAT_2_DIGEST  # as with stored sets (format 2)
    trained = dedup.payload_dictionary.dictionary
    assert trained is not None
    assert index.payload_dictionary() == trained.raw
    assert dictionary_id(index.dictionary_bytes(trained.id) or b"") == trained.id

    sizes = payload_sizes(dict(backend.scan_prefix(keys.DOC)))
    # The first two batches (1,000 documents) trained it; the next four used it.
    assert set(sizes) == {ZSTD_MAGICLESS, ZSTD_DICTIONARY}
    assert len(sizes[ZSTD_MAGICLESS]) + len(sizes[ZSTD_DICTIONARY]) == len(
        dict(backend.scan_prefix(keys.DOC))
    )
    plain = sum(sizes[ZSTD_MAGICLESS]) / len(sizes[ZSTD_MAGICLESS])
    with_dictionary = sum(sizes[ZSTD_DICTIONARY]) / len(sizes[ZSTD_DICTIONARY])
    assert with_dictionary < 0.75 * plain, (plain, with_dictionary)

    # Another process: no dictionary loaded; it finds the one its records name in the index.
    monkeypatch.setattr(payload_dictionary, "_known", {})
    reopened = DedupIndex(backend, IndexParams.of(CONFIG))
    again = Deduplicator(reopened, CONFIG)
    loaded = again.payload_dictionary.dictionary
    assert loaded is not None and loaded.id == trained.id
    monkeypatch.setattr(payload_dictionary, "_known", {})
    records = [decode_doc(v) for v in dict(backend.scan_prefix(keys.DOC)).values()]
    assert all(decode_text(r.payload) for r in records)

    # A reader that opens the index and decides nothing (the check process): opening it
    # is enough for its payloads to be read.
    monkeypatch.setattr(payload_dictionary, "_known", {})
    monkeypatch.setattr(payload_dictionary, "_sources", [])
    with pytest.raises(IndexCorruptError, match="dictionary"):
        decode_text(next(r.payload for r in records if r.payload[0] == ZSTD_DICTIONARY))
    reader = DedupIndex(backend, IndexParams.of(CONFIG))
    assert all(decode_text(r.payload) for r in records)
    assert reader.params == IndexParams.of(CONFIG)


def test_a_second_deduplicator_takes_the_stored_dictionary(backend_factory: BackendFactory) -> None:
    """Two deciders of one index (a shared one's instances) that gather texts one after
    the other: the second to reach its sample size uses the dictionary the first stored."""
    backend = backend_factory()
    docs = stream()
    first = Deduplicator(DedupIndex(backend, IndexParams.of(CONFIG)), CONFIG)
    second = Deduplicator(DedupIndex(backend, IndexParams.of(CONFIG)), CONFIG)
    for dedup in (first, second):
        dedup.payload_dictionary.train_documents = 1000
    decide(first, docs[:1000])
    first.payload_dictionary.wait()
    assert second.payload_dictionary.dictionary is None
    second.payload_dictionary.gather(second.sketch(docs[1000:2000]))
    assert first.payload_dictionary.dictionary is not None
    assert second.payload_dictionary.dictionary is first.payload_dictionary.dictionary
    assert (first.payload_dictionary.trained, second.payload_dictionary.trained) == (1, 0)
    assert second.payload_dictionary.adopted == 1


def stored_dictionaries(backend: Backend) -> int:
    """How many dictionaries the index stores (the one in use is named by ``Z`` alone)."""
    return sum(len(k) > 1 for k in backend.scan_keys(keys.DICTIONARY))


def test_a_group_reaching_its_sample_together_trains_one_dictionary(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instances of a shared index that reach the sample size at the same batch: the first
    claims the training and trains on a thread of its own, the others compress without a
    dictionary until it is stored, then use it; the index holds one."""
    backend = RedisBackend(redis_url, namespace=fresh_namespace())
    monkeypatch.setattr(dictionary, "LOOK_EVERY_S", 0.0)
    docs = stream()
    group = [Deduplicator(DedupIndex(backend, IndexParams.of(CONFIG)), CONFIG) for _ in range(3)]
    sketches = [dedup.sketch(docs[i * 600 : i * 600 + 600]) for i, dedup in enumerate(group)]
    for dedup, sk in zip(group, sketches, strict=True):
        dedup.payload_dictionary.train_documents = 500
        dedup.payload_dictionary.gather(sk)
    trainer, *others = (dedup.payload_dictionary for dedup in group)
    assert trainer.training and trainer.dictionary is None
    assert not any(o.training or o.dictionary for o in others)
    trainer.wait()
    assert trainer.dictionary is not None and trainer.trained == 1
    for other, sk in zip(others, sketches[1:], strict=True):
        other.gather(sk)
        assert other.dictionary is trainer.dictionary
        assert (other.trained, other.adopted) == (0, 1)
    assert stored_dictionaries(backend) == 1
    backend.close()


def test_a_claim_whose_holder_died_is_taken_over(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instance that claimed the training dies before storing a dictionary: once its
    claim expires, the next instance to look trains one from its own sample."""
    backend = RedisBackend(redis_url, namespace=fresh_namespace())
    monkeypatch.setattr(dictionary, "LOOK_EVERY_S", 0.0)
    index = DedupIndex(backend, IndexParams.of(CONFIG))
    dedup = Deduplicator(index, CONFIG)
    dedup.payload_dictionary.train_documents = 500
    sk = dedup.sketch(stream()[:600])
    claimed = time.monotonic()
    assert index.claim_dictionary_training(500)  # the one that dies
    assert not index.claim_dictionary_training(500)  # held: nobody else gets it
    dedup.payload_dictionary.gather(sk)
    assert not dedup.payload_dictionary.training  # the claim is held
    while not dedup.payload_dictionary.training and time.monotonic() < claimed + 10:
        time.sleep(0.05)
        dedup.payload_dictionary.gather(sk)
    assert dedup.payload_dictionary.training  # expired: claimed again, trained here
    assert time.monotonic() - claimed >= 0.5
    dedup.payload_dictionary.wait()
    assert dedup.payload_dictionary.dictionary is not None
    assert index.payload_dictionary() == dedup.payload_dictionary.dictionary.raw
    assert stored_dictionaries(backend) == 1
    backend.close()


def test_too_little_text_trains_none(backend_factory: BackendFactory) -> None:
    index = DedupIndex(backend_factory(), IndexParams.of(CONFIG))
    dedup = Deduplicator(index, CONFIG)
    dedup.payload_dictionary.train_documents = 20
    docs = [Document(f"d{i}", f"short text number {i}") for i in range(40)]
    dedup.process(docs)
    dedup.payload_dictionary.wait()  # a shared index trains on a thread of its own
    assert dedup.payload_dictionary.dictionary is None
    assert dedup.payload_dictionary.train_documents == 0  # not tried again
    assert index.payload_dictionary() is None


def test_a_payload_naming_an_unknown_dictionary_is_refused() -> None:
    payload = bytes([ZSTD_DICTIONARY]) + (0x5EED).to_bytes(4, "little") + b"\x00" * 8
    with pytest.raises(IndexCorruptError, match="dictionary 0x00005eed"):
        decode_text(payload)


def test_a_training_thread_that_fails_leaves_payloads_without_a_dictionary(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training on its own thread raises: the deciding thread goes on, compressing
    without a dictionary, and trains none again."""
    backend = RedisBackend(redis_url, namespace=fresh_namespace())
    dedup = Deduplicator(DedupIndex(backend, IndexParams.of(CONFIG)), CONFIG)
    dedup.payload_dictionary.train_documents = 500
    sk = dedup.sketch(stream()[:600])

    def failing(texts: object) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(payload_dictionary, "train", failing)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # no report in the log
    dedup.payload_dictionary.gather(sk)
    dedup.payload_dictionary.wait()
    assert dedup.payload_dictionary.dictionary is None
    assert dedup.payload_dictionary.train_documents == 0
    assert backend.get_many([keys.DICTIONARY])[0] is None
    backend.close()
