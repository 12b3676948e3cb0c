"""Repeated ids: the stored verdict comes back, and under ``revisions = "replay"`` a repeat
with other text is counted (``test_revisions.py`` has the default, deciding it again)."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.lookup_keys import content_digest, exact_key
from stream_dedup.core.normalize import normalize
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import Backend, DedupIndex, keys
from stream_dedup.index.params import IndexParams
from stream_dedup.index.records import decode_replay, decode_verdict, encode_verdict, text_tag
from stream_dedup.models import Document, Verdict, VerdictKind

DedupFactory = Callable[..., Deduplicator]


@pytest.fixture
def make_dedup(backend_factory: Callable[[], Backend]) -> DedupFactory:
    def make(**overrides: object) -> Deduplicator:
        config = DedupConfig(**overrides)  # type: ignore[arg-type]
        return Deduplicator(DedupIndex(backend_factory(), IndexParams.of(config)), config)

    return make


def article(seed: int, words: int = 120) -> str:
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(words)
    )


A, B = article(1), article(2)


def key_of(text: str) -> bytes:
    return exact_key(content_digest(normalize(text).encode("utf-8")))


def test_verdict_record_carries_the_text_tag_and_empty_content_none() -> None:
    v = Verdict("a", VerdictKind.UNIQUE, None, None, "a")
    raw = encode_verdict(v, key_of(A))
    body = json.loads(raw)
    assert body["t"] == content_digest(normalize(A).encode())[:8].hex()
    assert len(body["t"]) == 16
    assert body["t"] == text_tag(key_of(A))
    empty = Verdict("e", VerdictKind.UNIQUE, None, None, "e", empty=True)
    assert "t" not in json.loads(encode_verdict(empty, None))
    # Without a tag the record is byte for byte the one written before tags existed.
    assert encode_verdict(v) == b'{"k":"u","of":null,"s":null,"c":"a","e":false}'


def test_decode_replay_compares_the_texts() -> None:
    v = Verdict("a", VerdictKind.DUPLICATE, "x", 0.91, "x")
    raw = encode_verdict(v, key_of(A))
    same, differs = decode_replay("a", raw, key_of("  " + A.upper()))  # normalises equal
    assert not differs
    assert (same.verdict, same.duplicate_of, same.similarity, same.cluster_id) == (
        VerdictKind.DUPLICATE,
        "x",
        0.91,
        "x",
    )
    assert same.replayed
    assert decode_replay("a", raw, key_of(B))[1]
    assert decode_replay("a", raw, None)[1]  # now empty, first was not
    empty = encode_verdict(Verdict("e", VerdictKind.UNIQUE, None, None, "e", empty=True))
    assert not decode_replay("e", empty, None)[1]
    assert decode_replay("e", empty, key_of(A))[1]  # first was empty, now is not
    assert decode_verdict("a", raw) == same


def test_a_record_written_before_tags_decodes_and_is_never_mismatched() -> None:
    old = b'{"k":"d","of":"x","s":0.9,"c":"x","e":false}'
    verdict, differs = decode_replay("a", old, key_of(B))
    assert not differs
    assert (verdict.verdict, verdict.duplicate_of, verdict.replayed) == (
        VerdictKind.DUPLICATE,
        "x",
        True,
    )


def test_repeats_across_batches_count_only_other_texts(make_dedup: DedupFactory) -> None:
    dedup = make_dedup(revisions="replay")
    first = dedup.process([Document("a", A), Document("b", B), Document("e", "  ")])
    assert first.stats.mismatched_repeats == 0
    again = dedup.process(
        [
            Document("a", A.upper()),  # same normalised text
            Document("b", A),  # other text under b
            Document("e", B),  # was empty, now has text
            Document("c", B),  # new id: decided as usual
        ]
    )
    assert [v.replayed for v in again.verdicts] == [True, True, True, False]
    assert again.stats.replayed == 3
    assert again.stats.mismatched_repeats == 2
    assert [v.to_json() for v in again.verdicts[:3]] == [v.to_json() for v in first.verdicts]
    c = again.verdicts[3]
    assert (c.verdict, c.duplicate_of, c.similarity) == (VerdictKind.DUPLICATE, "b", 1.0)


def test_repeats_within_one_batch_are_compared_too(make_dedup: DedupFactory) -> None:
    dedup = make_dedup(revisions="replay")
    result = dedup.process(
        [
            Document("a", A),
            Document("a", A),  # same text
            Document("a", B),  # other text
            Document("e", ""),
            Document("e", A),  # was empty
            Document("e", " "),  # empty again
        ]
    )
    assert [v.replayed for v in result.verdicts] == [False, True, True, False, True, True]
    assert result.stats.replayed == 4
    assert result.stats.mismatched_repeats == 2
    assert dedup.index.counter("documents") == 2


def test_an_index_without_tags_replays_without_mismatches(
    backend_factory: Callable[[], Backend],
) -> None:
    backend = backend_factory()
    config = DedupConfig()
    dedup = Deduplicator(DedupIndex(backend, IndexParams.of(config)), config)
    dedup.process([Document("a", A)])
    # a's record as an index written before text tags holds it
    backend.write({keys.verdict_key("a"): b'{"k":"u","of":null,"s":null,"c":"a","e":false}'})
    again = dedup.process([Document("a", B)])
    assert again.verdicts[0].replayed
    assert again.verdicts[0].verdict is VerdictKind.UNIQUE
    assert again.stats.mismatched_repeats == 0


def test_new_documents_decide_as_without_repeats(make_dedup: DedupFactory) -> None:
    """The text tags change nothing about documents that are not repeats."""
    docs = [Document(f"d{i}", article(i % 7 + 10) if i % 3 else article(i)) for i in range(40)]
    plain = make_dedup().process(docs).verdicts
    dedup = make_dedup()
    dedup.process([Document("other", A)])
    tagged = dedup.process(docs)
    assert tagged.stats.mismatched_repeats == 0
    assert [v.to_json() for v in tagged.verdicts] == [v.to_json() for v in plain]
