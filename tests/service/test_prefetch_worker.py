"""The sketch worker: a helper process that decodes and sketches as the service process would."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Message

from stream_dedup.core.bands import band_hashes
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.normalize import normalize
from stream_dedup.core.payload import ZSTD_MAGICLESS, decode_text
from stream_dedup.core.payload_dictionary import train
from stream_dedup.core.sketch import Sketch, sketch, sketch_packed, unpack
from stream_dedup.decode import MessageFormat, decode_messages
from stream_dedup.index.keys import bucket_keys
from stream_dedup.service.events import Source
from stream_dedup.service.inputs import Decoded, InputDecoder, MessageBatch
from stream_dedup.service.prefetch.ahead import SketchAhead
from stream_dedup.service.prefetch.worker import NICENESS, SketchWorker, SketchWorkerError
from tests.core.test_sketch import EDGE_CASES

CONFIG = DedupConfig()


def assert_same(got: Sketch, want: Sketch) -> None:
    assert got.size == want.size
    assert got.live == want.live
    assert np.array_equal(got.sigs, want.sigs)
    assert got.bucket_keys == want.bucket_keys
    assert got.exact_keys == want.exact_keys
    assert np.array_equal(got.bucket_order, want.bucket_order)
    assert np.array_equal(got.bucket_shared, want.bucket_shared)
    assert np.array_equal(got.bucket_fingerprints, want.bucket_fingerprints)
    assert len(got.sets) == len(want.sets)
    for a, b in zip(got.sets, want.sets, strict=True):
        assert np.array_equal(a, b)


@pytest.fixture(scope="module")
def worker() -> Iterator[SketchWorker]:
    w = SketchWorker(CONFIG)
    yield w
    w.close()


def record(doc_id: str, text: str) -> bytes:
    return json.dumps({"id": doc_id, "text": text}).encode()


BAD_RECORDS = [b"{not json", b'{"text": "no id"}', b"\xff\xfe", None, b'{"id": "x"}']


def test_packed_sketch_survives_the_pipe(kijiji_ads: list[tuple[str, str]]) -> None:
    """What the worker sends, pickled as the shared region pickles it, is the same sketch."""
    texts = [c for _, c in kijiji_ads[:300]] + EDGE_CASES
    plan = CONFIG.band_plan()
    packed = sketch_packed(texts, CONFIG, plan)
    got = unpack(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert_same(got, sketch(texts, CONFIG, plan))
    # Keys whose band hash ends in zero bytes keep them (a void array, not a bytes array).
    assert any(k.endswith(b"\x00") for k in got.bucket_keys)
    assert got.bucket_keys == bucket_keys(band_hashes(got.sigs, plan, CONFIG.seed))


def test_worker_decodes_and_sketches_as_in_process(
    worker: SketchWorker, kijiji_ads: list[tuple[str, str]]
) -> None:
    plan = CONFIG.band_plan()
    values: list[bytes | None] = [record(i, c) for i, c in kijiji_ads]
    edge: list[bytes | None] = [record(f"e{i}", t) for i, t in enumerate(EDGE_CASES)]
    mixed = values[:50] + BAD_RECORDS + values[50:60]
    for batch in (values[:1000], values[1000:] + edge, edge[:1], mixed):
        worker.submit(batch)
        assert worker.busy
        decoded, sketched = worker.result()
        assert decoded == decode_messages(batch, None, None, MessageFormat())
        assert sketched is not None
        assert_same(sketched, sketch(decoded[1], CONFIG, plan))
    assert not worker.busy
    ids, contents, errors = decoded
    assert len(ids) == len(contents) == 60
    assert [(i, reason) for i, reason, _ in errors] == [
        (50, "invalid_json"),
        (51, "missing_id"),
        (52, "invalid_utf8"),
        (53, "missing_content"),
        (54, "missing_content"),
    ]


def test_the_worker_yields_the_cpu_to_the_service(worker: SketchWorker) -> None:
    """The worker runs NICENESS below this process: the service's loop wins a busy core."""
    worker.submit(BAD_RECORDS)  # waits until the worker is ready (niced at its start)
    worker.result()
    assert worker.pid is not None
    stat = Path(f"/proc/{worker.pid}/stat").read_text()
    theirs = int(stat.rsplit(")", 1)[1].split()[16])  # field 19: nice
    assert theirs == min(os.nice(0) + NICENESS, 19)


def test_a_batch_with_no_document_has_no_sketch(worker: SketchWorker) -> None:
    worker.submit(BAD_RECORDS)
    decoded, sketched = worker.result()
    assert decoded[:2] == ([], []) and len(decoded[2]) == len(BAD_RECORDS)
    assert sketched is None


def test_text_records_take_their_ids_from_keys_or_positions() -> None:
    fmt = MessageFormat(text=True, max_bytes=20)
    w = SketchWorker(CONFIG, fmt)
    try:
        values: list[bytes | None] = [b"keyed text", b"unkeyed text", b"x" * 21, b"\xff"]
        keys: list[bytes | None] = [b"k1", None, None, None]
        positions = [("news", 2, 7 + i) for i in range(4)]
        w.submit(values, keys, positions)
        decoded, sketched = w.result()
    finally:
        w.close()
    assert decoded == (
        ["k1", "news-2-8"],
        ["keyed text", "unkeyed text"],
        [
            (2, "too_large", "value is 21 bytes, the maximum is 20"),
            (3, "invalid_utf8", decoded[2][1][2]),
        ],
    )
    assert sketched is not None and sketched.size == 2


def test_a_batch_the_worker_fails_on_raises_and_the_worker_goes_on(worker: SketchWorker) -> None:
    worker.submit([record("a", "fine"), 5])  # type: ignore[list-item]
    with pytest.raises(SketchWorkerError, match="failed on the batch"):
        worker.result()
    worker.submit([record("b", "still working")])
    decoded, sketched = worker.result()
    assert decoded[0] == ["b"] and sketched is not None and sketched.size == 1


def test_a_killed_worker_is_reported_then_started_again() -> None:
    w = SketchWorker(CONFIG)
    try:
        w.submit([record("a", "first batch")])
        w.result()
        pid = w.pid
        assert pid is not None
        # Stopped first, so the worker cannot answer the batch before the kill lands.
        os.kill(pid, signal.SIGSTOP)
        w.submit([record("b", "a batch the worker never answers")])
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SketchWorkerError, match="exited"):
            w.result()
        w.submit([record("c", "after the restart")])
        assert w.result()[0][0] == ["c"]
        assert w.pid != pid
    finally:
        w.close()


def test_the_worker_exits_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from stream_dedup.core.config import DedupConfig\n"
            "from stream_dedup.service.prefetch.worker import SketchWorker\n"
            'w = SketchWorker(DedupConfig()); w.submit([b\'{"id": 1, "text": "ready?"}\'])\n'
            "w.result()\n"
            "print(w.pid, flush=True); time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the sketch worker outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; an exited process its new parent has not reaped yet is a zombie
    (state Z), which still answers ``kill(pid, 0)``."""
    try:
        with Path(f"/proc/{pid}/stat").open() as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


DECODER = InputDecoder(MessageFormat())


def _records(name: str, texts: list[str]) -> MessageBatch:
    sources = [
        Source("in", 0, i, None, None, record(f"{name}-{i}", t), []) for i, t in enumerate(texts)
    ]
    return MessageBatch([], sources)


@pytest.mark.parametrize("with_worker", [True, False])
def test_sketch_ahead_processes_in_order_with_the_right_sketch(with_worker: bool) -> None:
    failures: list[SketchWorkerError] = []
    ahead = SketchAhead(CONFIG if with_worker else None, DECODER, failures.append)
    seen: list[tuple[str, Sketch | None]] = []

    def process(decoded: Decoded, sketched: Sketch | None) -> None:
        name = decoded.docs[0].id.split("-")[0] if decoded.docs else "empty"
        assert decoded == DECODER.decode(MessageBatch(decoded.batch, all_sources(decoded)))
        if sketched is not None:
            want = sketch([d.content for d in decoded.docs], CONFIG, CONFIG.band_plan())
            assert_same(sketched, want)
        seen.append((name, sketched))

    try:
        ahead.advance(_records("a", ["one text", "two texts"]), process)
        assert ahead.holding == with_worker
        ahead.advance(_records("b", ["three"]), process)
        ahead.advance(MessageBatch([], []), process)
        ahead.advance(None, process)
        ahead.drain(process)
        assert not ahead.holding
    finally:
        ahead.close()
    assert [name for name, _ in seen] == ["a", "b", "empty"]
    assert all((sk is not None) == with_worker for name, sk in seen if name != "empty")
    assert failures == []


def test_sketch_ahead_starts_from_idle_in_process_and_pipelines_under_load() -> None:
    """With nothing held, a batch of at most ``inline_max`` messages is processed at once
    (decoded and sketched here: no sketch handed in), and a larger one is split: its first
    third is processed here while the worker sketches the rest, which is held. While a
    batch is held, a new one goes to the worker whole, so the worker's work overlaps the
    deciding of the batch before it. Order is always kept, a batch's first part first.
    """
    failures: list[SketchWorkerError] = []
    ahead = SketchAhead(CONFIG, DECODER, failures.append, inline_max=2)
    seen: list[tuple[list[str], bool]] = []

    def process(decoded: Decoded, sketched: Sketch | None) -> None:
        seen.append(([d.id for d in decoded.docs], sketched is not None))

    try:
        ahead.advance(_records("small", ["one text", "two texts"]), process)
        assert not ahead.holding and seen == [(["small-0", "small-1"], False)]
        large = ["a", "b c", "d e f", "g", "h i", "j k l"]
        ahead.advance(_records("large", large), process)
        assert ahead.holding  # the last two thirds, at the worker
        assert seen[-1] == (["large-0", "large-1"], False)  # the first third, here
        ahead.advance(_records("next", ["m"]), process)  # the worker is busy: queue behind
        assert ahead.holding
        ahead.advance(None, process)
        assert not ahead.holding
        ahead.advance(_records("last", ["n"]), process)
    finally:
        ahead.close()
    assert seen == [
        (["small-0", "small-1"], False),
        (["large-0", "large-1"], False),
        (["large-2", "large-3", "large-4", "large-5"], True),
        (["next-0"], True),
        (["last-0"], False),
    ]
    assert failures == []


def test_sketch_ahead_with_inline_max_0_hands_every_batch_to_the_worker_whole() -> None:
    ahead = SketchAhead(CONFIG, DECODER, lambda exc: pytest.fail(str(exc)), inline_max=0)
    seen: list[tuple[int, bool]] = []

    def process(decoded: Decoded, sketched: Sketch | None) -> None:
        seen.append((len(decoded.docs), sketched is not None))

    try:
        ahead.advance(_records("a", ["one", "two", "three", "four"]), process)
        assert ahead.holding and seen == []
        ahead.drain(process)
    finally:
        ahead.close()
    assert seen == [(4, True)]


def test_records_split_into_a_run_per_partition_each() -> None:
    sources = [Source("in", p, o, None, None, b"{}", []) for p in (0, 1) for o in (5, 6, 7)]
    head, rest = MessageBatch([], sources).split(4)
    assert [(s.partition, s.offset) for s in head.sources] == [(0, 5), (0, 6), (0, 7), (1, 5)]
    assert [(s.partition, s.offset) for s in rest.sources] == [(1, 6), (1, 7)]


def all_sources(decoded: Decoded) -> list[Source]:
    """The decoded batch's sources, good and bad, in their original order."""
    return sorted(decoded.sources + [s for s, _ in decoded.undecodable], key=lambda s: s.offset)


def test_sketch_ahead_dead_letters_what_the_worker_could_not_decode() -> None:
    ahead = SketchAhead(CONFIG, DECODER, lambda exc: pytest.fail(str(exc)))
    seen: list[Decoded] = []
    try:
        good = _records("g", ["a text", "another text"]).sources
        bad = Source("in", 0, 9, None, b"k", b"{broken", [("h", b"v")])
        ahead.advance(MessageBatch([], [good[0], bad, good[1]]), lambda d, s: None)
        ahead.drain(lambda d, s: seen.append(d))
    finally:
        ahead.close()
    (decoded,) = seen
    assert [d.id for d in decoded.docs] == ["g-0", "g-1"]
    assert decoded.sources == good
    ((source, error),) = decoded.undecodable
    assert source is bad and error.reason == "invalid_json" and error.raw == b"{broken"


def test_take_back_returns_the_undecided_batch() -> None:
    ahead = SketchAhead(CONFIG, DECODER, lambda exc: None)
    try:
        held = _records("held", ["text"])
        ahead.advance(held, lambda d, s: pytest.fail("nothing should be processed"))
        assert ahead.holding
        assert ahead.take_back() is held.batch
        assert not ahead.holding
        ahead.advance(_records("next", ["more"]), lambda d, s: None)  # the pipe is in step
        seen: list[Sketch | None] = []
        ahead.drain(lambda d, s: seen.append(s))
        assert seen and seen[0] is not None and seen[0].size == 1
    finally:
        ahead.close()


def test_the_worker_compresses_with_the_dictionary_it_is_handed(
    kijiji_ads: list[tuple[str, str]],
) -> None:
    """Payloads from the worker: without a dictionary until it is handed one, then with it,
    equal to the in-process sketch's; a restarted worker is handed it again."""
    trained = train([normalize(c) for _, c in kijiji_ads[:1500]])
    assert trained is not None
    texts = [c for _, c in kijiji_ads[1500:1700]]
    values: list[bytes | None] = [record(f"k{i}", c) for i, c in enumerate(texts)]
    plan = CONFIG.band_plan()
    w = SketchWorker(CONFIG)
    try:
        w.use_dictionary(None)
        w.submit(values)
        _, plain = w.result()
        w.use_dictionary(trained)
        w.submit(values)
        _, with_dictionary = w.result()
        assert plain is not None and with_dictionary is not None
        assert plain.payloads == sketch(texts, CONFIG, plan).payloads
        assert with_dictionary.payloads == sketch(texts, CONFIG, plan, trained).payloads
        assert all(p[0] == ZSTD_MAGICLESS for p in plain.payloads)
        assert all(p.startswith(trained.header) for p in with_dictionary.payloads)
        assert sum(map(len, with_dictionary.payloads)) < 0.7 * sum(map(len, plain.payloads))
        assert [decode_text(p) for p in with_dictionary.payloads] == [
            decode_text(p) for p in plain.payloads
        ]
        pid = w.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        w.submit(values)  # started again, with the dictionary
        _, again = w.result()
        assert w.pid != pid
        assert again is not None and again.payloads == with_dictionary.payloads
    finally:
        w.close()


def test_the_worker_sketches_a_later_turn_early_and_drops_it_for_another() -> None:
    """The group's order asks the worker to sketch an instance's next turn while it
    decides this one: the result is taken for exactly those messages; asked for others,
    it is dropped and the worker is free for the usual pipeline. Only the sketches
    taken count as the worker's."""
    ahead = SketchAhead(CONFIG, DECODER, lambda exc: pytest.fail(str(exc)))
    keys = [Message(topic="in", partition=0, offset=i, value=b"") for i in range(2)]
    seen: list[tuple[list[str], bool]] = []
    try:
        texts = ["one text here", "two texts here"]
        assert ahead.idle
        assert ahead.sketch_early(keys, _records("early", texts))
        assert not ahead.holding  # nothing is decided from it until it is taken
        assert not ahead.idle
        assert not ahead.sketch_early(keys, _records("again", ["x"]))  # one at a time
        got = ahead.take_early(list(keys))  # the same messages, another list
        assert got is not None and got[1] is not None
        assert [d.id for d in got[0].docs] == ["early-0", "early-1"]
        assert_same(got[1], sketch(texts, CONFIG, CONFIG.band_plan()))
        assert ahead.idle and ahead.worker_sketched == 2
        assert ahead.take_early(keys) is None  # taken once
        assert ahead.sketch_early(keys, _records("other", ["y"]))
        assert ahead.take_early(keys[:1]) is None  # not what was asked for: dropped
        assert ahead.worker_sketched == 2
        ahead.advance(_records("next", ["more text"]), lambda d, s: None)
        assert ahead.holding and not ahead.sketch_early(keys, _records("busy", ["z"]))
        assert not ahead.idle
        ahead.drain(lambda d, s: seen.append(([x.id for x in d.docs], s is not None)))
    finally:
        ahead.close()
    assert seen == [(["next-0"], True)]
    assert ahead.worker_sketched == 3
