"""Checks over every backend: the deciding path's candidates and similarities, the top k in
order, exact containment both ways, and nothing written."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.normalize import normalize
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import check_texts
from stream_dedup.errors import ConfigError
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import RetentionChange
from stream_dedup.models import CheckMatch, Document, Relation
from tests.index.test_dedup import DedupFactory, article, build, edit


@pytest.fixture
def make_dedup(backend_factory: Callable[[], Backend]) -> DedupFactory:
    """``make(**config)``: a deduplicator over a fresh index of the parametrised backend."""
    return lambda **overrides: build(backend_factory(), **overrides)


def check(dedup: Deduplicator, texts: list[str], k: int = 5) -> list[list[CheckMatch]]:
    return check_texts(dedup.index, dedup.config, dedup.plan, texts, k)


def contents(dedup: Deduplicator) -> dict[tuple[int, bytes], bytes]:
    """Every key and value the index's backend holds, in every epoch."""
    backend = dedup.index._backend
    return {
        (epoch, key): value
        for epoch in backend.epochs()
        for key, value in backend.scan_prefix(b"", epoch)
    } | {(0, k): v for k, v in backend.scan_prefix(b"", 0)}


def brute(a: str, b: str) -> tuple[float, float, float]:
    """Jaccard and both containments of two texts' character 5-gram sets, by Python sets
    of the grams themselves (independent of the package's hashing)."""
    x, y = ({n[i : i + 5] for i in range(len(n) - 4)} for n in map(normalize, (a, b)))
    shared = len(x & y)
    return shared / len(x | y), shared / len(x), shared / len(y)


def test_finds_the_near_duplicate_with_the_deciding_paths_similarity(
    make_dedup: DedupFactory,
) -> None:
    dedup = make_dedup()
    base = [Document(f"a{i}", article(i)) for i in range(40)]
    dedup.process(base)
    asked = [edit(article(i), 6, seed=100 + i) for i in range(0, 40, 4)]
    answers = check(dedup, asked, k=3)
    decided = dedup.decide([Document(f"new{i}", t) for i, t in enumerate(asked)]).verdicts
    for i, (answer, verdict) in enumerate(zip(answers, decided, strict=True)):
        assert verdict.is_duplicate
        top = answer[0]
        assert (top.id, top.similarity) == (verdict.duplicate_of, verdict.similarity)
        assert top.id == f"a{4 * i}" and top.relation is Relation.NEAR_DUPLICATE
        assert top.cluster_id == verdict.cluster_id
        sim, contained, reverse = brute(asked[i], article(4 * i))
        assert top.similarity == pytest.approx(sim, abs=0.01)  # 32-bit hashes may collide
        assert top.containment == pytest.approx(contained, abs=0.01)
        assert top.reverse_containment == pytest.approx(reverse, abs=0.01)
    assert check(dedup, [article(999), ""], k=5) == [[], []]


def test_top_k_in_order_and_an_excerpt_scored_by_containment(make_dedup: DedupFactory) -> None:
    """Versions of one story at falling similarity come back most similar first, cut at
    k; an excerpt of a story has low similarity but its containment in it is ~1."""
    dedup = make_dedup(threshold=0.5)
    story = article(1, words=300)
    versions = [Document(f"v{n}", edit(story, n, seed=n)) for n in (2, 30, 10, 60, 20)]
    dedup.process([*versions, Document("other", article(2))])
    found = check(dedup, [story], k=3)[0]
    assert [m.id for m in found] == ["v2", "v10", "v20"]
    sims = [m.similarity for m in found]
    assert sims == sorted(sims, reverse=True) and sims[0] > 0.9
    assert len(check(dedup, [story], k=10)[0]) == 5
    half = " ".join(versions[0].content.split(" ")[:180])  # 60 % of v2: an excerpt
    excerpt = check(dedup, [half], k=1)[0][0]
    sim, contained, reverse = brute(half, versions[0].content)
    assert excerpt.id == "v2" and excerpt.similarity < 0.65
    assert excerpt.similarity == pytest.approx(sim, abs=0.01)
    assert excerpt.containment == pytest.approx(contained, abs=0.01) and contained > 0.97
    assert excerpt.reverse_containment == pytest.approx(reverse, abs=0.01)


def test_below_the_threshold_is_listed_as_similar(make_dedup: DedupFactory) -> None:
    dedup = make_dedup(threshold=0.9)
    story = article(3, words=300)
    dedup.process([Document("near", edit(story, 2, 1)), Document("far", edit(story, 40, 2))])
    found = {m.id: m for m in check(dedup, [story], k=5)[0]}
    assert found["near"].relation is Relation.NEAR_DUPLICATE
    assert found["near"].similarity >= 0.9
    if "far" in found:  # a candidate only if it shares a band: then it is scored
        assert found["far"].relation is Relation.SIMILAR
        assert found["far"].similarity < 0.9


def test_a_check_writes_nothing_and_changes_no_later_verdict(make_dedup: DedupFactory) -> None:
    first = [Document(f"a{i}", article(i)) for i in range(30)]
    later = [Document(f"b{i}", edit(article(i), 5, seed=i)) for i in range(0, 30, 3)]
    later += [Document("c", article(77))]
    checked, plain = make_dedup(), make_dedup()
    for dedup in (checked, plain):
        dedup.process(first)
    before = contents(checked)
    stats = checked.index.stats()
    for _ in range(3):
        assert check(checked, [d.content for d in later], k=4)[0]
    assert contents(checked) == before
    after = checked.index.stats()
    assert (after.documents, after.indexed, after.duplicates) == (
        stats.documents,
        stats.indexed,
        stats.duplicates,
    )
    assert checked.process(later).verdicts == plain.process(later).verdicts
    assert contents(checked) == contents(plain)


def test_the_same_text_is_found_first_and_texts_do_not_see_each_other(
    make_dedup: DedupFactory,
) -> None:
    dedup = make_dedup()
    story = article(5)
    dedup.process([Document("x", story), Document("y", article(6))])
    same, twin = check(dedup, [story.upper(), story + " (updated)"], k=2)
    assert same[0].id == "x" and same[0].similarity == 1.0 and same[0].containment == 1.0
    assert [m.id for m in twin] == ["x"]  # not the other text of the call


def test_signature_verification_estimates_and_has_no_containment(
    make_dedup: DedupFactory,
) -> None:
    dedup = make_dedup(verify="signature")
    story = article(8)
    dedup.process([Document("x", story)])
    asked = edit(story, 4, 9)
    top = check(dedup, [asked])[0][0]
    verdict = dedup.decide([Document("q", asked)]).verdicts[0]
    assert (top.id, top.similarity) == ("x", verdict.similarity)
    assert top.containment is None and top.reverse_containment is None


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "3"])
def test_k_must_be_a_positive_whole_number(make_dedup: DedupFactory, k: object) -> None:
    dedup = make_dedup()
    with pytest.raises(ConfigError, match="k"):
        check(dedup, ["text"], k=k)  # type: ignore[arg-type]


def test_checks_on_other_threads_while_batches_commit_and_epochs_expire(
    backend_factory: Callable[[], Backend],
) -> None:
    """The service's case: checks read the index on other threads while the writer
    commits batches, opening and dropping epochs (max_documents); every check answers,
    from committed documents, and the writer's verdicts are those of an index never
    checked."""
    config = DedupConfig()
    held = RetentionChange.of(None, 400)

    def open_one() -> Deduplicator:
        return Deduplicator(DedupIndex(backend_factory(), IndexParams.of(config), held), config)

    checked, plain = open_one(), open_one()
    stories = [article(i) for i in range(60)]
    batches = [
        [Document(f"b{b}-{i}", edit(stories[(b + i) % 60], 3, b * 100 + i)) for i in range(100)]
        for b in range(12)
    ]
    errors: list[BaseException] = []
    answers: list[list[list[CheckMatch]]] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            try:
                answers.append(check(checked, stories[:20], k=3))
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                return

    askers = [threading.Thread(target=ask) for _ in range(2)]
    for t in askers:
        t.start()
    try:
        verdicts = [checked.process(batch).verdicts for batch in batches]
    finally:
        done.set()
        for t in askers:
            t.join(30)
    assert not errors, errors
    assert len(answers) >= 2 and any(any(a) for a in answers)
    ids = {d.id for batch in batches for d in batch}
    assert all(m.id in ids for a in answers for per_text in a for m in per_text)
    assert len(checked.index.timeline.epochs) > 1 or checked.index.cutoff() > 0
    assert verdicts == [plain.process(batch).verdicts for batch in batches]


def test_an_id_with_two_revisions_is_named_once_by_its_closer_revision(
    make_dedup: DedupFactory,
) -> None:
    """Each text an id is seen with is indexed as its own revision; a check near both
    names the id once, with the similarity of the revision closer to the text, and fills
    ``k`` with other ids."""
    dedup = make_dedup(threshold=0.5)
    story = article(11, words=300)
    dedup.process([Document("x", story)])
    second = dedup.process([Document("x", edit(story, 8, seed=1))]).verdicts[0]
    assert second.revision == 2  # indexed as a second document under the same id
    dedup.process([Document("y", edit(story, 12, seed=2))])
    assert dedup.index.stats().indexed == 3
    asked = edit(story, 2, seed=3)
    found = check(dedup, [asked], k=2)[0]
    assert [m.id for m in found] == ["x", "y"]
    assert found[0].similarity == pytest.approx(brute(asked, story)[0], abs=0.01)
    assert [m.id for m in check(dedup, [asked], k=5)[0]] == ["x", "y"]
