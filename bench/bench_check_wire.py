"""The round trip between the check process's front and a reader: pickled against raw bytes.

A check sends a reader its reads (:class:`~stream_dedup.dedup.check.CheckReads`) and gets
back what the index holds (:class:`~stream_dedup.dedup.check.Held`). This measures that
round trip alone: a real index of ``--documents`` generated news stories, real reads and
replies for ``--texts`` checks (half of them re-runs of indexed stories), and an echo
process on the other end of a :mod:`multiprocessing` socket pair that decodes each
request, and encodes and sends back the reply it was given. Two ways, alternated
``--rounds`` times: ``pickle`` (``Connection.send`` of the tuples, as before) and
``raw`` (:mod:`stream_dedup.service.check_wire`). Per round trip: the CPU of each side
(this process's, and the echo's from ``/proc``) and the wall time; medians.

    .venv/bin/python bench/bench_check_wire.py --rounds 4
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from bench_readers import CONFIG, generate_news

from stream_dedup.core.sketch import sketch
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import CheckReads, Held, read_held
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.service import check_wire as wire


def echo(conn: Connection, other: Connection, mode: str, replies: list[Held]) -> None:
    """The reader's side: each request decoded, the next reply encoded and sent."""
    other.close()
    n = 0
    while True:
        try:
            if mode == "pickle":
                conn.recv()
                conn.send(("held", replies[n % len(replies)]))
            else:
                wire.decode_reads(conn.recv_bytes())
                conn.send_bytes(wire.encode_held(replies[n % len(replies)]))
        except EOFError:
            return
        n += 1


def cpu_of(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def one(mode: str, requests: list[CheckReads], replies: list[Held], n: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=echo, args=(theirs, mine, mode, replies))
    proc.start()
    theirs.close()
    assert proc.pid is not None

    def trip(i: int) -> None:
        if mode == "pickle":
            mine.send(("read", requests[i % len(requests)]))
            mine.recv()
        else:
            mine.send_bytes(wire.encode_reads(requests[i % len(requests)]))
            wire.decode_held(mine.recv_bytes())

    for i in range(200):
        trip(i)
    other, own, wall = cpu_of(proc.pid), time.process_time(), time.perf_counter()
    for i in range(n):
        trip(i)
    out = {
        "front_us": (time.process_time() - own) / n * 1e6,
        "reader_us": (cpu_of(proc.pid) - other) / n * 1e6,
        "wall_us": (time.perf_counter() - wall) / n * 1e6,
    }
    mine.close()
    proc.join(10)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--documents", type=int, default=5000)
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--trips", type=int, default=5000, help="round trips per run")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    plan = CONFIG.band_plan()
    with tempfile.TemporaryDirectory(prefix="bench-wire-") as tmp:
        index = open_index(Path(tmp) / "index", IndexParams.of(CONFIG))
        stories = generate_news(args.documents, 7)
        Deduplicator(index, CONFIG).process([Document(f"s{i}", t) for i, t in enumerate(stories)])
        texts = generate_news(args.texts // 2, 10_000_000) + stories[: args.texts // 2]
        requests = [CheckReads.of(sketch([t], CONFIG, plan, payloads=False), 100) for t in texts]
        replies = [read_held(index, r) for r in requests]
        index.close()
    records = statistics.median(len(h.records) for h in replies)
    print(f"{len(requests)} checks, median {records:.0f} records per reply")
    runs: dict[str, list[dict[str, float]]] = {"pickle": [], "raw": []}
    for r in range(args.rounds):
        for mode in ("pickle", "raw") if r % 2 == 0 else ("raw", "pickle"):
            got = one(mode, requests, replies, args.trips)
            runs[mode].append(got)
            print(mode, {k: round(v, 1) for k, v in got.items()}, f"load {os.getloadavg()[0]:.1f}")
    for mode, results in runs.items():
        med = {k: round(statistics.median(x[k] for x in results), 1) for k in results[0]}
        print("median", mode, med)
    return 0


if __name__ == "__main__":
    sys.exit(main())
