"""A shared index on real Redis servers: instances racing, the lease, crash recovery."""

from __future__ import annotations

import collections
import io
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from stream_dedup.cli.app import main
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import IndexLeaseLostError, IndexUnreachableError
from stream_dedup.index import DedupIndex, keys
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.opener import RedisSettings, open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_layout import RedisLayout, encode_grouped_redo
from stream_dedup.index.retention import Retention
from stream_dedup.models import Document
from stream_dedup.tools import redis_local
from tests.conftest import fresh_namespace

from .shared_instances import decide_and_store
from .test_dedup import article


def test_copies_racing_at_two_instances_make_exactly_one_unique(
    shared: Callable[[], Deduplicator],
) -> None:
    """Each round, two instances get the two copies of a story at the same moment (a
    barrier releases both): one copy must be unique and the other its duplicate."""
    first, second = shared(), shared()
    rounds = 40
    barrier = threading.Barrier(2)
    verdicts: dict[str, str | None] = {}

    def run(dedup: Deduplicator, name: str) -> None:
        for r in range(rounds):
            story = article(1000 + r)
            text = story if name == "a" else story.replace(" ", "  ", 3) + " (wire)"
            barrier.wait(timeout=30)
            verdicts.update(decide_and_store(dedup, [Document(f"{name}{r}", text)]))

    threads = [threading.Thread(target=run, args=(d, n)) for d, n in ((first, "a"), (second, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(verdicts) == 2 * rounds
    for r in range(rounds):
        pair = {f"a{r}", f"b{r}"}
        uniques = [i for i in pair if verdicts[i] is None]
        assert len(uniques) == 1, (r, {i: verdicts[i] for i in pair})
        (copy,) = pair - set(uniques)
        assert verdicts[copy] == uniques[0]
    with first.index.exclusive():  # counters are re-read inside a lease
        assert first.index.counter("documents") == 2 * rounds


def test_an_instance_finds_what_another_decided(shared: Callable[[], Deduplicator]) -> None:
    first, second = shared(), shared()
    originals = [Document(f"o{i}", article(i)) for i in range(30)]
    copies = [Document(f"c{i}", article(i) + " update") for i in range(30)]
    assert set(decide_and_store(first, originals).values()) == {None}
    assert decide_and_store(second, copies) == {f"c{i}": f"o{i}" for i in range(30)}
    # The first instance sees the second's documents and counters too.
    assert decide_and_store(first, [Document("again", article(3) + " again")]) == {"again": "o3"}
    assert first.index.counter("documents") == 61


def test_a_write_cut_short_by_a_release_before_redo_queues_is_finished_at_opening(
    shared: Callable[[], Deduplicator], shared_redis_url: str
) -> None:
    """An index left by a release that kept one redo record (a plain key, ``{ns}!redo``)
    and crashed between it and the end of its write: opening applies the whole write
    before anything is read. (Crashes after a versioned commit point are in
    ``test_shared_redo.py``.)"""
    first = shared()
    decide_and_store(first, [Document(f"o{i}", article(i)) for i in range(10)])
    backend = first.index._backend
    assert isinstance(backend, RedisBackend)
    with first.index.exclusive():
        result = first.decide([Document(f"c{i}", article(i) + " copy") for i in range(10)])
        pending = first.prepare(result)
        # A kill after the redo record, before the rest: the redo record stays, nothing
        # else (that release wrote the document records before it; here they are in it).
        grouped = pending.write.flat().grouped(backend._keys)
        backend._client.set(backend._keys.redo, encode_grouped_redo(pending.write.epoch, grouped))
        assert backend.get_many([keys.verdict_key("c0")]) == [None]
    second = shared()  # opening takes the lease, which applies the redo record
    assert not backend._client.exists(backend._keys.redo)
    assert second.index.counter("documents") == 20
    # c3's verdict is there: its text again replays it ...
    assert decide_and_store(second, [Document("c3", article(3) + " copy")]) == {"c3": "o3"}
    # ... and the write's document records are read like any: a near copy of c5 finds it
    near = Document("d5", article(5) + " copy, with a line added")
    assert decide_and_store(second, [near]) == {"d5": "c5"}


def test_a_lease_lost_to_another_instance_stores_nothing(
    shared: Callable[[], Deduplicator],
) -> None:
    first, second = shared(), shared()
    backend = first.index._backend
    assert isinstance(backend, RedisBackend)
    with first.index.exclusive():
        result = first.decide([Document("late", article(7))])
        pending = first.prepare(result)
        backend._client.delete(backend._lock)  # the lease expired while paused
        with (
            second.index.exclusive(),
            pytest.raises(IndexLeaseLostError, match="took the index's lease"),
        ):
            first.index.apply(pending)
    assert second.index.read([keys.verdict_key("late")]) == [None]
    # nothing at all: the document records travel in the redo record the lease refused
    assert [k for e in backend.epochs() for k in backend.scan_keys(b"d", e)] == []


def test_a_wrong_password_is_a_clear_error(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.execute_command("ACL", "SETUSER", "dedup-test", "on", ">secret", "~*", "+@all")
        url = redis_url.replace("redis://", "redis://dedup-test:wrong@")
        with pytest.raises(IndexUnreachableError, match=r"dedup-test:\*\*\*@.*index.redis.url"):
            RedisBackend(url, namespace=fresh_namespace())
        ok = RedisBackend(redis_url.replace("redis://", "redis://dedup-test:secret@"))
        ok.close()
    finally:
        client.execute_command("ACL", "DELUSER", "dedup-test")
        client.close()


def test_stats_reads_a_shared_index(
    shared: Callable[[], Deduplicator], shared_redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dedup = shared()
    decide_and_store(dedup, [Document(f"o{i}", article(i)) for i in range(12)])
    decide_and_store(dedup, [Document("c1", article(1) + " copy")])
    backend = dedup.index._backend
    assert isinstance(backend, RedisBackend)
    namespace = backend.location.rsplit("namespace ", 1)[1].rstrip(")")
    out = io.StringIO()
    assert main(["stats", "--redis", shared_redis_url, "--namespace", namespace], out) == 0
    rows = dict(line.split(None, 1) for line in out.getvalue().splitlines())
    assert rows["documents"].strip() == "13"
    assert rows["duplicates"].strip() == "1"
    assert rows["size"].startswith("in Redis")
    missing = ["stats", "--redis", shared_redis_url, "--namespace", "no-such-index"]
    assert main(missing, io.StringIO()) == 3
    assert "is not a stream-dedup index" in capsys.readouterr().err


def test_tls_with_a_password_and_a_private_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rediss://``, ``tls_ca_file`` and ``password``, against a TLS-only server; ``stats``
    takes the password from the service's variable and the CA from ``--tls-ca-file``."""
    if redis_local.redis_server_binary() is None or shutil.which("openssl") is None:
        pytest.skip("needs redis-server and openssl")
    with redis_local.tls_node(tmp_path, password="tls-secret") as (url, ca):
        backend = RedisBackend(url, password="tls-secret", tls_ca_file=str(ca))
        try:
            backend.write({b"M": b"meta"})
            assert backend.get_many([b"M"]) == [b"meta"]
        finally:
            backend.close()
        with pytest.raises(IndexUnreachableError, match="certificate verify failed"):
            RedisBackend(url, password="tls-secret")  # the private CA is not trusted
        with pytest.raises(IndexUnreachableError, match=r"index\.redis\.url"):
            RedisBackend(url, password="wrong", tls_ca_file=str(ca))
        where = RedisSettings(url, "tls-stats", password="tls-secret", tls_ca_file=str(ca))
        open_index(where, IndexParams.of(DedupConfig())).close()
        stats = ["stats", "--redis", url, "--namespace", "tls-stats", "--tls-ca-file", str(ca)]
        assert main(stats, io.StringIO()) == 3  # no password
        assert "index.redis" in capsys.readouterr().err
        monkeypatch.setenv("STREAM_DEDUP_INDEX__REDIS__PASSWORD", "tls-secret")
        out = io.StringIO()
        assert main(stats, out) == 0
        assert "documents           0\n" in out.getvalue()


def test_a_lease_reads_no_clock_points_without_retention(
    shared: Callable[[], Deduplicator],
) -> None:
    """Every lease re-reads the shared state: without retention that must not include the
    clock's change points, one record per batch, which would make each lease slower than
    the one before."""
    dedup = shared()
    for n in range(5):
        docs = [
            Document(f"t{n}-{i}", article(100 * n + i), time=1_000 * (n * 60 + i)) for i in range(4)
        ]
        decide_and_store(dedup, docs)
    backend = dedup.index._backend
    assert isinstance(backend, RedisBackend)
    assert len(list(backend.scan_keys(keys.POINTS))) == 5  # one per batch, kept
    scanned: list[bytes] = []
    original = backend.scan_prefix
    backend.scan_prefix = lambda prefix, epoch=0: scanned.append(prefix) or original(prefix, epoch)  # type: ignore[method-assign]
    with dedup.index.exclusive():
        assert dedup.index.counter("documents") == 20
        assert dedup.index.timeline.clock == 4 * 60 + 3  # the latest document time, seconds
    assert scanned == []


def test_two_instances_with_retention_decide_as_one_and_read_only_new_clock_points(
    shared_redis_url: str,
) -> None:
    """Retention on a shared index: instances taking turns give the verdicts of one
    in-memory index under the same retention, and a lease reads the clock's change points
    of the other instance's batches only (no scan of every point held)."""
    namespace, config = fresh_namespace(), DedupConfig()
    params, retention = IndexParams.of(config), Retention(window=600, max_documents=50)
    backends = [RedisBackend(shared_redis_url, namespace=namespace) for _ in range(2)]
    instances = [Deduplicator(DedupIndex(b, params, retention), config) for b in backends]
    reference = Deduplicator(DedupIndex(MemoryBackend(), params, retention), config)
    docs = []
    for j in range(200):  # 30 s apart: the window holds 20 documents, max_documents 50
        source = j - 15 if j % 3 == 0 else j - 40 if j % 7 == 0 else j  # inside / outside
        docs.append(Document(f"d{j}", article(max(source, 0) + 5000), time=30_000 * j))
    scans: list[bytes] = []
    for backend in backends:
        scan = backend.scan_prefix
        backend.scan_prefix = (  # type: ignore[method-assign]
            lambda prefix, epoch=0, scan=scan: scans.append(prefix) or scan(prefix, epoch)
        )
    try:
        for b in range(0, len(docs), 10):
            batch = docs[b : b + 10]
            shared = decide_and_store(instances[(b // 10) % 2], batch)
            alone = {v.id: v.duplicate_of for v in reference.process(batch).verdicts}
            assert shared == alone, b
        assert scans == []
        with instances[0].index.exclusive():
            stats = instances[0].index.stats()
        alone_stats = reference.index.stats()
        assert (stats.held, stats.expired, stats.epochs) == (
            alone_stats.held,
            alone_stats.expired,
            alone_stats.epochs,
        )
        assert stats.held == 21  # the window: 600 s of documents 30 s apart, and the last
        # Expired epochs were dropped from Redis: what is left is what the index lists.
        assert set(backends[0].epochs()) - {0} == set(instances[0].index.timeline.numbers())
    finally:
        for backend in backends:
            backend.close()


class CountingRedis(redis.Redis):
    """A real client to the test's Redis that counts the scans it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: collections.Counter[str] = collections.Counter()

    def hscan(self, *args: Any, **kwargs: Any) -> Any:
        self.sent["HSCAN"] += 1
        return super().hscan(*args, **kwargs)

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        self.sent["SCAN"] += 1
        return super().scan(*args, **kwargs)


def test_a_scan_walks_only_the_side_its_prefix_can_live_on(redis_url: str) -> None:
    """The stored offsets (read at every partition assignment) are own keys: finding them
    walks no hash of document records, whose number grows with the index; records are
    found without walking the keyspace for own keys."""
    namespace = fresh_namespace()
    backend = RedisBackend(redis_url, namespace=namespace)
    client = CountingRedis.from_url(redis_url)
    try:
        offsets = {keys.offset_key("news", p): p.to_bytes(8, "little") for p in range(3)}
        docs = {keys.doc_key(i): b"record" for i in range(5)}
        backend.write({**offsets, **docs})
        layout = RedisLayout(namespace)
        assert layout.scan(client, keys.OFFSET, 0) == sorted(offsets)
        assert client.sent["HSCAN"] == 0 and client.sent["SCAN"] >= 1
        client.sent.clear()
        assert layout.scan(client, keys.DOC, 0) == sorted(docs)
        assert client.sent["SCAN"] == 0 and client.sent["HSCAN"] == 256
        client.sent.clear()
        assert set(layout.scan(client, b"", 0)) >= {*offsets, *docs}  # both sides
        assert client.sent["SCAN"] >= 1 and client.sent["HSCAN"] == 256
        assert dict(backend.scan_prefix(keys.OFFSET)) == offsets
    finally:
        client.close()
        backend.close()
