"""Checks while a writer commits large batches: the check process's two readers against
one follower in the answering process, without the broker or the service.

A writer process (its own interpreter, as the service is) commits batches of
``--batch`` news-like documents to a RocksDB index as fast as it can, up to
``--docs-per-s``, and writes a byte to a pipe after each commit. This process answers
checks at ``--rate`` per second, open-loop on 4 threads (latency from each check's due
time), and follows the commits in one of two ways, alternated ``--rounds`` times:

- ``follower``: a :class:`~stream_dedup.index.follower.FollowerIndex` in this process,
  caught up on the main thread (as the check process did before its readers: rocksdict
  keeps the interpreter lock for the whole catch-up);
- ``readers``: :class:`~stream_dedup.service.check_readers.Readers`, a turn per notice.

Per phase: p50/p95/p99 of the checks, the longest catch-up, and for ``readers`` the p99
of the reads' round trip (the wait for the reader's lock and the reader's answer) beside
the p99 of the rest of the check (sketch and scoring in this process).

    .venv/bin/python bench/bench_readers.py --rounds 2
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from prometheus_client import CollectorRegistry

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import CheckReads, Held, check_texts
from stream_dedup.index import open_index
from stream_dedup.index.opener import open_follower
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.service.check_metrics import CheckMetrics
from stream_dedup.service.check_readers import Readers
from stream_dedup.tools.generate import StreamSpec, write_jsonl

CONFIG = DedupConfig()


def generate_news(n: int, seed: int) -> list[str]:
    """``n`` generated news stories (title and text), from ``seed``."""
    buf = io.StringIO()
    write_jsonl(StreamSpec(documents=n, seed=seed), buf)
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    return [f"{r.get('title', '')} {r.get('text', '')}" for r in rows]


def write(where: str, batch: int, docs_per_s: float, notices: Connection, stop: Connection) -> None:
    """The writer: batches of generated news committed until told to stop."""
    index = open_index(where, IndexParams.of(CONFIG))
    dedup = Deduplicator(index, CONFIG)
    n = 0
    started = time.monotonic()
    try:
        while not stop.poll(0):
            docs = [Document(f"d{n + i}", t) for i, t in enumerate(generate_news(batch, n))]
            dedup.process(docs)
            n += batch
            notices.send_bytes(b"c")
            ahead = started + n / docs_per_s - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    finally:
        index.close()


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def phase(where: Path, mode: str, args: argparse.Namespace) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    notices_r, notices_w = ctx.Pipe(duplex=False)
    stop_r, stop_w = ctx.Pipe(duplex=False)
    writer = ctx.Process(
        target=write, args=(str(where), args.batch, args.docs_per_s, notices_w, stop_r)
    )
    registry = CollectorRegistry()
    metrics = CheckMetrics(registry)
    readers: Readers | None = None
    follower = None
    if mode == "readers":
        readers = Readers(where, CONFIG, ("WARNING", "json", 5), metrics)
        readers.start()
        readers.wait_serving()
        while readers.serving() < 2:
            time.sleep(0.05)
    else:
        follower = open_follower(where)
    reads_s: list[float] = []

    def reads(q: CheckReads) -> Held:
        assert readers is not None
        t0 = time.perf_counter()
        held = readers.read(q)
        reads_s.append(time.perf_counter() - t0)
        return held

    answer = reads if readers is not None else follower
    assert answer is not None
    plan = CONFIG.band_plan()
    texts = generate_news(200, 10_000_000)
    check_texts(answer, CONFIG, plan, texts[:1], 5)  # warm
    latencies: list[float] = []
    own: list[float] = []
    done = threading.Event()
    follows: list[float] = []

    def follow_loop() -> None:
        while not done.is_set():
            if not notices_r.poll(0.2):
                continue
            while notices_r.poll(0):
                notices_r.recv_bytes()
            t0 = time.perf_counter()
            if readers is not None:
                readers.follow()
            else:
                assert follower is not None
                follower.follow()
            follows.append(time.perf_counter() - t0)

    writer.start()
    turner = threading.Thread(target=follow_loop)
    turner.start()
    start = time.perf_counter() + 0.5
    total = int(args.rate * args.seconds)

    def client(k: int) -> None:
        for i in range(k, total, 4):
            due = start + i / args.rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            before = len(reads_s)
            t0 = time.perf_counter()
            check_texts(answer, CONFIG, plan, [texts[i % len(texts)]], 5)
            t1 = time.perf_counter()
            latencies.append(t1 - due)
            if readers is not None and len(reads_s) > before:
                own.append(t1 - t0)

    clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    done.set()
    stop_w.send(True)
    writer.join(60)
    turner.join(30)
    if readers is not None:
        readers.close()
    if follower is not None:
        follower.close()
    notices_r.close()
    return {
        "p50_ms": quantile(latencies, 0.5) * 1e3,
        "p95_ms": quantile(latencies, 0.95) * 1e3,
        "p99_ms": quantile(latencies, 0.99) * 1e3,
        "follow_max_ms": max(follows, default=0.0) * 1e3,
        "turns": float(len(follows)),
        "reads_p99_ms": quantile(reads_s, 0.99) * 1e3,
        "check_p99_ms": quantile(own, 0.99) * 1e3,
        "load_1m": os.getloadavg()[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--docs-per-s", type=float, default=5000.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"follower": [], "readers": []}
    with tempfile.TemporaryDirectory(prefix="bench-readers-") as tmp:
        where = Path(tmp) / "index"
        seed = Deduplicator(open_index(where, IndexParams.of(CONFIG)), CONFIG)
        seed.process([Document(f"s{i}", t) for i, t in enumerate(generate_news(5000, 7))])
        seed.index.close()
        for r in range(args.rounds):
            for mode in ("follower", "readers") if r % 2 == 0 else ("readers", "follower"):
                got = phase(where, mode, args)
                results[mode].append(got)
                print(mode, {k: round(v, 1) for k, v in got.items()}, flush=True)
    for mode, runs in results.items():
        med = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
        print("median", mode, med)
    return 0


if __name__ == "__main__":
    sys.exit(main())
