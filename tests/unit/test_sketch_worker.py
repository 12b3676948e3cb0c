"""The sketch worker: a helper process whose sketches equal the service process's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stream_dedup.ahead import SketchAhead
from stream_dedup.config import DedupConfig
from stream_dedup.models import Document
from stream_dedup.outputs import Decoded
from stream_dedup.sketch import Sketch, pack, sketch, unpack
from stream_dedup.sketch_worker import SketchWorker, SketchWorkerError

from .test_sketch import EDGE_CASES

CONFIG = DedupConfig()


def assert_same(got: Sketch, want: Sketch) -> None:
    assert got.size == want.size
    assert got.live == want.live
    assert np.array_equal(got.sigs, want.sigs)
    assert got.bucket_keys == want.bucket_keys
    assert got.exact_keys == want.exact_keys
    assert np.array_equal(got.bucket_order, want.bucket_order)
    assert np.array_equal(got.bucket_shared, want.bucket_shared)
    assert len(got.sets) == len(want.sets)
    for a, b in zip(got.sets, want.sets, strict=True):
        assert np.array_equal(a, b)


@pytest.fixture(scope="module")
def worker() -> Iterator[SketchWorker]:
    w = SketchWorker(CONFIG)
    yield w
    w.close()


def test_pack_round_trip(kijiji_ads: list[tuple[str, str]]) -> None:
    texts = [c for _, c in kijiji_ads[:300]] + EDGE_CASES
    sk = sketch(texts, CONFIG, CONFIG.band_plan())
    assert_same(unpack(pack(sk)), sk)


def test_worker_sketches_equal_in_process(
    worker: SketchWorker, kijiji_ads: list[tuple[str, str]]
) -> None:
    plan = CONFIG.band_plan()
    texts = [c for _, c in kijiji_ads]
    for batch in (texts[:1000], texts[1000:] + EDGE_CASES, EDGE_CASES[:1]):
        worker.submit(batch)
        assert worker.busy
        assert_same(worker.result(), sketch(batch, CONFIG, plan))
    assert not worker.busy


def test_a_batch_the_worker_fails_on_raises_and_the_worker_goes_on(worker: SketchWorker) -> None:
    worker.submit(["fine", None])  # type: ignore[list-item]
    with pytest.raises(SketchWorkerError, match="failed on the batch"):
        worker.result()
    worker.submit(["still working"])
    assert worker.result().size == 1


def test_a_killed_worker_is_reported_then_started_again() -> None:
    w = SketchWorker(CONFIG)
    try:
        w.submit(["first batch"])
        w.result()
        pid = w.pid
        assert pid is not None
        w.submit(["a batch the worker never answers"])
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SketchWorkerError, match="exited"):
            w.result()
        w.submit(["after the restart"])
        assert w.result().size == 1
        assert w.pid != pid
    finally:
        w.close()


def test_the_worker_exits_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from stream_dedup.config import DedupConfig\n"
            "from stream_dedup.sketch_worker import SketchWorker\n"
            "w = SketchWorker(DedupConfig()); w.submit(['ready?']); w.result()\n"
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


def _decoded(name: str, texts: list[str]) -> Decoded:
    docs = [Document(f"{name}-{i}", t) for i, t in enumerate(texts)]
    return Decoded([], docs, [], [])


@pytest.mark.parametrize("with_worker", [True, False])
def test_sketch_ahead_processes_in_order_with_the_right_sketch(with_worker: bool) -> None:
    failures: list[SketchWorkerError] = []
    ahead = SketchAhead(CONFIG if with_worker else None, failures.append)
    seen: list[tuple[str, Sketch | None]] = []

    def process(decoded: Decoded, sketched: Sketch | None) -> None:
        name = decoded.docs[0].id.split("-")[0] if decoded.docs else "empty"
        if sketched is not None:
            want = sketch([d.content for d in decoded.docs], CONFIG, CONFIG.band_plan())
            assert_same(sketched, want)
        seen.append((name, sketched))

    try:
        ahead.advance(_decoded("a", ["one text", "two texts"]), process)
        assert ahead.holding == with_worker
        ahead.advance(_decoded("b", ["three"]), process)
        ahead.advance(Decoded([], [], [], []), process)
        ahead.advance(None, process)
        ahead.drain(process)
        assert not ahead.holding
    finally:
        ahead.close()
    assert [name for name, _ in seen] == ["a", "b", "empty"]
    assert all((sk is not None) == with_worker for name, sk in seen if name != "empty")
    assert failures == []


def test_take_back_returns_the_undecided_batch() -> None:
    ahead = SketchAhead(CONFIG, lambda exc: None)
    try:
        held = _decoded("held", ["text"])
        ahead.advance(held, lambda d, s: pytest.fail("nothing should be processed"))
        assert ahead.holding
        assert ahead.take_back() is held.batch
        assert not ahead.holding
        ahead.advance(_decoded("next", ["more"]), lambda d, s: None)  # the pipe is in step
        seen: list[Sketch | None] = []
        ahead.drain(lambda d, s: seen.append(s))
        assert seen and seen[0] is not None and seen[0].size == 1
    finally:
        ahead.close()
