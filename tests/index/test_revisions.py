"""Revisions on every index backend: an id seen again with other text is decided again.

Memory, RocksDB, Redis and Redis Cluster (the shared index's backends): a new revision is
decided against the index and indexed, a later exact copy of its text finds it, the same
texts again replay their own revision's verdict identically (also for a batch holding two
revisions of an id, decided again over an index that already holds its writes, as after a
crash), and ``revisions = "replay"`` keeps the behaviour from before revisions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.lookup_keys import content_digest, exact_key
from stream_dedup.core.normalize import normalize
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import IndexMismatchError
from stream_dedup.index import Backend, DedupIndex, keys
from stream_dedup.index.params import FORMAT_VERSION, IndexParams
from stream_dedup.index.records import text_of
from stream_dedup.models import Document, Verdict, VerdictKind

from .test_repeats import article

DedupFactory = Callable[..., Deduplicator]

A, B, C = article(1), article(2), article(3)
#: A near-identical edit of A: one word of 120 changed.
A_EDIT = A.replace(A.split()[60], "corrected", 1)


def tag(text: str) -> str:
    return text_of(exact_key(content_digest(normalize(text).encode("utf-8"))))


def fields(v: Verdict) -> tuple[object, ...]:
    """Everything an event says of a verdict (its ``replayed`` mark aside)."""
    return (v.verdict, v.duplicate_of, v.similarity, v.cluster_id, v.empty, v.revision, v.previous)


@pytest.fixture
def make_dedup(backend_factory: Callable[[], Backend]) -> DedupFactory:
    def make(**overrides: object) -> Deduplicator:
        config = DedupConfig(**overrides)  # type: ignore[arg-type]
        return Deduplicator(DedupIndex(backend_factory(), IndexParams.of(config)), config)

    return make


def test_a_new_text_is_a_revision_decided_indexed_and_found(make_dedup: DedupFactory) -> None:
    dedup = make_dedup()
    (first,) = dedup.process([Document("a", A)]).verdicts
    result = dedup.process([Document("a", B)])
    (second,) = result.verdicts
    assert fields(second) == (VerdictKind.UNIQUE, None, None, "a", False, 2, tag(A))
    assert not second.replayed
    assert result.stats.revisions == 1
    assert second.to_json()["revision"] == 2 and "revision" not in first.to_json()
    assert dedup.index.counter("documents") == 2
    assert dedup.index.counter("indexed") == 2
    (copy,) = dedup.process([Document("x", B)]).verdicts  # a later copy of the new text
    assert (copy.verdict, copy.duplicate_of, copy.similarity) == (VerdictKind.DUPLICATE, "a", 1.0)
    (third,) = dedup.process([Document("a", C)]).verdicts
    assert (third.revision, third.previous) == (3, tag(B))


def test_replays_of_each_revision_are_identical_and_write_nothing(
    make_dedup: DedupFactory,
) -> None:
    dedup = make_dedup()
    (first,) = dedup.process([Document("a", A)]).verdicts
    (second,) = dedup.process([Document("a", B)]).verdicts
    documents = dedup.index.counter("documents")
    again = dedup.process([Document("a", B), Document("a", "  " + A.upper()), Document("a", B)])
    assert [v.replayed for v in again.verdicts] == [True, True, True]
    assert [fields(v) for v in again.verdicts] == [fields(second), fields(first), fields(second)]
    assert again.puts == {} and again.stats.revisions == 0 and again.stats.replayed == 3
    assert dedup.index.counter("documents") == documents


def test_an_edit_may_match_its_own_earlier_revision(make_dedup: DedupFactory) -> None:
    """The documented choice: a revision is decided on its content alone, and the id's
    earlier revisions are candidates like any document."""
    dedup = make_dedup()
    dedup.process([Document("a", A)])
    (edit,) = dedup.process([Document("a", A_EDIT)]).verdicts
    assert (edit.verdict, edit.duplicate_of, edit.cluster_id, edit.revision) == (
        VerdictKind.DUPLICATE,
        "a",
        "a",
        2,
    )
    assert edit.similarity is not None and 0.8 <= edit.similarity < 1.0


def test_two_revisions_in_one_batch_and_its_replay_after_a_crash(
    make_dedup: DedupFactory,
) -> None:
    batch = [
        Document("a", A),
        Document("a", B),  # revision 2, in the same batch
        Document("y", B),  # a copy of it, later in the batch
        Document("a", A),  # revision 1 again
        Document("a", ""),  # revision 3: emptied
        Document("a", B),  # revision 2 again
    ]
    dedup = make_dedup()
    result = dedup.decide(batch)
    v = result.verdicts
    assert [x.revision for x in v] == [1, 2, 1, 1, 3, 2]
    assert [x.replayed for x in v] == [False, False, False, True, False, True]
    assert (v[1].previous, v[4].previous, v[4].empty) == (tag(A), tag(B), True)
    assert (v[2].verdict, v[2].duplicate_of) == (VerdictKind.DUPLICATE, "a")
    assert fields(v[3]) == fields(v[0]) and fields(v[5]) == fields(v[1])
    assert result.stats.revisions == 2
    dedup.commit(result)
    assert dedup.index.counter("documents") == 4  # a three times, y once
    # The service replays a batch whose writes the index may already hold: same verdicts.
    replay = dedup.decide(batch)
    assert [fields(x) for x in replay.verdicts] == [fields(x) for x in v]
    assert all(x.replayed for x in replay.verdicts)
    assert replay.puts == {}


def test_the_record_keeps_every_revision_and_one_revision_is_the_old_format(
    make_dedup: DedupFactory,
) -> None:
    dedup = make_dedup()
    dedup.process([Document("a", A)])
    (single,) = dedup.index.read([keys.verdict_key("a")])
    assert single == b'{"k":"u","of":null,"s":null,"c":"a","e":false,"t":"%s"}' % tag(A).encode()
    dedup.process([Document("a", B)])
    (both,) = dedup.index.read([keys.verdict_key("a")])
    assert both is not None
    first, second = (json.loads(line) for line in both.split(b"\n"))
    assert (first["t"], second["t"]) == (tag(A), tag(B))


def test_an_old_record_reads_as_revision_1(backend_factory: Callable[[], Backend]) -> None:
    backend = backend_factory()
    config = DedupConfig()
    dedup = Deduplicator(DedupIndex(backend, IndexParams.of(config)), config)
    dedup.process([Document("a", A)])
    # a's record as an index of format 2 holds it (a duplicate of x, tagged with A's text)
    old = b'{"k":"d","of":"x","s":0.9,"c":"x","e":false,"t":"%s"}' % tag(A).encode()
    backend.write({keys.verdict_key("a"): old})
    (replay,) = dedup.process([Document("a", A)]).verdicts
    assert fields(replay) == (VerdictKind.DUPLICATE, "x", 0.9, "x", False, 1, None)
    (revised,) = dedup.process([Document("a", B)]).verdicts
    assert (revised.revision, revised.previous, revised.replayed) == (2, tag(A), False)


def test_replay_mode_keeps_the_behaviour_before_revisions(make_dedup: DedupFactory) -> None:
    dedup = make_dedup(revisions="replay")
    (first,) = dedup.process([Document("a", A)]).verdicts
    result = dedup.process([Document("a", B), Document("x", B)])
    repeat, copy = result.verdicts
    assert repeat.replayed and fields(repeat) == fields(first)
    assert (result.stats.mismatched_repeats, result.stats.revisions) == (1, 0)
    assert copy.verdict is VerdictKind.UNIQUE  # B was never indexed under a
    assert dedup.index.counter("documents") == 2


def test_replay_mode_over_an_index_with_revisions_replays_each(
    backend_factory: Callable[[], Backend],
) -> None:
    backend = backend_factory()
    deciding = DedupConfig()
    index = DedupIndex(backend, IndexParams.of(deciding))
    dedup = Deduplicator(index, deciding)
    first, second = dedup.process([Document("a", A), Document("a", B)]).verdicts
    replaying = Deduplicator(index, DedupConfig(revisions="replay"))
    result = replaying.process([Document("a", A), Document("a", B), Document("a", C)])
    assert [fields(v) for v in result.verdicts] == [fields(first), fields(second), fields(second)]
    assert result.stats.mismatched_repeats == 1  # C: the id's latest verdict, counted


def test_an_index_of_format_2_opens_and_its_first_commit_upgrades_it(
    backend_factory: Callable[[], Backend],
) -> None:
    backend = backend_factory()
    config = DedupConfig()
    params = IndexParams.of(config)
    assert params.format_version == FORMAT_VERSION == 6
    old = dataclasses.replace(params, format_version=2)
    backend.write({keys.META: old.to_bytes()})
    backend.write({keys.verdict_key("a"): b'{"k":"u","of":null,"s":null,"c":"a","e":false}'})
    index = DedupIndex(backend, params)  # asked for format 4: reads format 2 as it is
    assert index.params == params
    assert backend.get_many([keys.META])[0] == old.to_bytes()  # opening writes nothing
    assert index.stats().params.format_version == 2  # `stats` shows the format stored
    dedup = Deduplicator(index, config)
    (replay,) = dedup.process([Document("a", A)]).verdicts  # a format 2 record: revision 1
    assert replay.replayed and replay.revision == 1
    assert backend.get_many([keys.META])[0] == params.to_bytes()
    assert index.stats().params.format_version == FORMAT_VERSION
    with pytest.raises(IndexMismatchError, match="format_version"):  # older versions refuse
        DedupIndex(backend, old)
