"""A follower index (the service's check process) reading what another index object
commits: a RocksDB secondary instance on the writer's directory, caught up after each
commit, reopened when retention opens or lets go an epoch; checks from it answer as
checks from the writer; it writes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import check_texts
from stream_dedup.index import DedupIndex, open_index
from stream_dedup.index.follower import FollowerIndex
from stream_dedup.index.opener import open_follower
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import RetentionChange
from stream_dedup.index.rocks import RocksBackend
from stream_dedup.index.rocks_families import epoch_docs_family, epoch_family
from stream_dedup.models import Document
from tests.index.test_dedup import article, edit


def files_digest(path: Path) -> dict[str, str]:
    """Every file of the writer's directory and a digest of its bytes."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.iterdir())
        if p.is_file() and p.name != "LOCK"
    }


def writer(path: Path, config: DedupConfig, keep: int | None = None) -> Deduplicator:
    """The writer, opened as the service opens it (a secondary follows any RocksDB index:
    none recycles its log files, on which a secondary tailing the log stalls)."""
    retention = RetentionChange.of(None, keep) if keep else None
    index = open_index(path, IndexParams.of(config), retention=retention)
    return Deduplicator(index, config)


def batch(b: int, size: int = 50) -> list[Document]:
    return [
        Document(f"b{b}-{i}", edit(article(b * size + i), 2, b * 1000 + i)) for i in range(size)
    ]


def race_the_opening(
    monkeypatch: pytest.MonkeyPatch, dedup: Deduplicator, between: list[int]
) -> None:
    """Let the writer commit batch ``between.pop()`` (once) between a view's listing of
    the column families and its opening of them."""
    real = Rdict

    def listing_then_a_commit(*args: Any) -> list[str]:
        names: list[str] = real.list_cf(*args)
        if between:
            dedup.process(batch(between.pop()))  # a new epoch: families made, committed
            dedup.index._backend.flush()  # type: ignore[attr-defined]
        return names

    class RacedRdict:
        list_cf = staticmethod(listing_then_a_commit)

        def __new__(cls, *args: Any, **kwargs: Any) -> Rdict:  # type: ignore[misc]
            return real(*args, **kwargs)

    monkeypatch.setattr("stream_dedup.index.rocks.Rdict", RacedRdict)


def test_a_follower_sees_each_commit_once_told_and_answers_as_the_writer(tmp_path: Path) -> None:
    config = DedupConfig()
    dedup = writer(tmp_path / "index", config)
    dedup.process(batch(0))
    follower = open_follower(tmp_path / "index")
    try:
        assert isinstance(follower, FollowerIndex)
        plan = dedup.plan
        asked = [article(3), article(70)]  # in batch 0; in batch 1, not committed yet
        first = check_texts(follower, config, plan, asked, 3)
        assert [m.id for m in first[0]] == ["b0-3"] and first[1] == []
        dedup.process(batch(1))
        # Not followed yet: the view stays at the commit it followed.
        assert check_texts(follower, config, plan, asked, 3)[1] == []
        assert follower.counter("documents") == 50
        follower.follow()
        answers = check_texts(follower, config, plan, asked, 3)
        assert answers == check_texts(dedup.index, config, plan, asked, 3)
        assert [m.id for m in answers[1]] == ["b1-20"]
        assert follower.counter("documents") == dedup.index.counter("documents") == 100
        assert follower.catch_ups == 1
    finally:
        follower.close()
        dedup.index.close()


def test_a_follower_reopens_for_a_new_retention_epoch_and_one_let_go(tmp_path: Path) -> None:
    """Retention keeps 100 documents: the writer opens epochs and drops them as batches
    come; the follower, caught up after every commit, holds the writer's live epochs and
    finds each batch's documents, never an expired one."""
    config = DedupConfig()
    dedup = writer(tmp_path / "index", config, keep=100)
    dedup.process(batch(0))
    follower = open_follower(tmp_path / "index")
    backend = follower._backend
    seen_epochs: set[int] = set()
    try:
        for b in range(1, 8):
            dedup.process(batch(b))
            dedup.index._backend.flush()  # type: ignore[attr-defined]
            follower.follow()  # the families of a new epoch are on disk: a reopen
            asked = [article(b * 50 + 7), article(7)]  # this batch's; the first batch's
            got = check_texts(follower, config, dedup.plan, asked, 2)
            assert got == check_texts(dedup.index, config, dedup.plan, asked, 2)
            assert [m.id for m in got[0]] == [f"b{b}-7"]
            assert follower.timeline.numbers() == dedup.index.timeline.numbers()
            assert set(backend.epochs()) == set(dedup.index.timeline.numbers()) | {0}
            seen_epochs.update(follower.timeline.numbers())
        assert got[1] == []  # batch 0 expired long ago
        assert len(seen_epochs) >= 3  # epochs were opened and let go meanwhile
    finally:
        follower.close()
        dedup.index.close()


def test_a_follower_writes_nothing_into_the_writers_directory(tmp_path: Path) -> None:
    config = DedupConfig()
    dedup = writer(tmp_path / "index", config)
    dedup.process(batch(0))
    dedup.index.close()
    before = files_digest(tmp_path / "index")
    follower = open_follower(tmp_path / "index")
    check_texts(follower, config, config.band_plan(), [article(5), article(999)], 3)
    follower.close()
    assert files_digest(tmp_path / "index") == before
    with pytest.raises(RuntimeError, match="read-only"):
        follower.prepare({}, {})


def test_a_follower_on_redis_reads_the_writers_commits(redis_url: str) -> None:
    from stream_dedup.index.opener import RedisSettings

    config = DedupConfig()
    where = RedisSettings(redis_url, namespace="follow")
    index: DedupIndex = open_index(where, IndexParams.of(config))
    dedup = Deduplicator(index, config)
    follower = open_follower(where)
    try:
        dedup.process(batch(0))
        follower.follow()
        got = check_texts(follower, config, dedup.plan, [article(9)], 2)
        assert [m.id for m in got[0]] == ["b0-9"]
        assert follower.counter("documents") == 50
    finally:
        follower.close()
        index.close()


def test_a_view_opened_while_the_writer_creates_an_epoch_skips_it(tmp_path: Path) -> None:
    """The writer creates (and drops) an epoch's two families one after the other: a
    secondary or read-only view opened in between sees one, holding nothing committed,
    and opens without it instead of failing."""
    config = DedupConfig()
    dedup = writer(tmp_path / "idx", config)
    dedup.process(batch(0))
    dedup.index.close()
    families = Rdict.list_cf(str(tmp_path / "idx"))
    db = Rdict(
        str(tmp_path / "idx"),
        Options(raw_mode=True),
        column_families={name: Options(raw_mode=True) for name in families},
    )
    db.create_column_family(epoch_family(7), Options(raw_mode=True))  # its docs not yet
    try:
        for kind in ({"secondary": True}, {"read_only": True}):
            view = RocksBackend(tmp_path / "idx", **kind)
            assert view.epochs() == [0]
            view.close()
        db.create_column_family(epoch_docs_family(7), Options(raw_mode=True))
        view = RocksBackend(tmp_path / "idx", read_only=True)
        assert view.epochs() == [0, 7]  # both families: the epoch is held
        view.close()
    finally:
        db.close()


@pytest.mark.parametrize(
    "keep",
    [
        pytest.param(400, id="an-epoch-opened"),  # epochs of 50 documents, none dropped yet
        pytest.param(100, id="an-epoch-dropped"),  # epochs of 12: each batch drops some
    ],
)
def test_a_view_reopened_while_the_writer_commits_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    """A reopen lists the writer's families, then opens them, and a batch can commit in
    between. One that opens an epoch leaves the view naming an epoch it did not open;
    one that drops an epoch's families makes the opening fail. Either way the view is
    opened again, rather than fail (the check process died of it once, restarted during
    ingest)."""
    config = DedupConfig()
    dedup = writer(tmp_path / "index", config, keep=keep)
    dedup.process(batch(0))
    follower = open_follower(tmp_path / "index")
    between = [2]  # the batch the writer commits between a listing and the opening
    try:
        dedup.process(batch(1))  # a new epoch: the next follow reopens the view
        dedup.index._backend.flush()  # type: ignore[attr-defined]
        race_the_opening(monkeypatch, dedup, between)
        follower.follow()
        assert not between  # the writer did commit in the middle of the reopen
        assert follower.timeline.numbers() == dedup.index.timeline.numbers()
        asked = [article(2 * 50 + 7)]
        got = check_texts(follower, config, dedup.plan, asked, 1)
        assert [m.id for m in got[0]] == ["b2-7"]
    finally:
        follower.close()
        dedup.index.close()


@pytest.mark.parametrize(
    "keep",
    [
        pytest.param(400, id="an-epoch-opened"),
        pytest.param(100, id="an-epoch-dropped"),
    ],
)
def test_a_view_opened_while_the_writer_commits_holds_the_epochs_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    """The first opening races the writer as a reopen does: a batch committed between the
    listing of the families and the opening leaves a view naming an epoch it did not
    open. It is opened again before it answers (a check reader started during ingest
    died of it once, at its warm-up check)."""
    config = DedupConfig()
    dedup = writer(tmp_path / "index", config, keep=keep)
    dedup.process(batch(0))
    dedup.index._backend.flush()  # type: ignore[attr-defined]
    between = [1]
    race_the_opening(monkeypatch, dedup, between)
    follower = open_follower(tmp_path / "index")
    try:
        assert not between  # the writer did commit in the middle of the opening
        assert follower.timeline.numbers() == dedup.index.timeline.numbers()
        got = check_texts(follower, config, dedup.plan, [article(50 + 7)], 1)
        assert [m.id for m in got[0]] == ["b1-7"]
    finally:
        follower.close()
        dedup.index.close()
