"""The cost of containment: offline throughput and index bytes, on against off, paired.

Decides the same documents through the offline path (a :class:`Deduplicator` over a fresh
RocksDB index, timed from opening the index to closing it, as ``stream-dedup dedup
--index`` runs) with ``containment = 0`` and ``0.8``, alternating the two in each round,
and reports each one's median docs/s, the ratio of the medians and the median of the
rounds' ratios, and the process's CPU time per document (steadier than wall time on a
shared machine). Bytes are the index's
key and value bytes after a full compaction (``bench_bytes.rocks_breakdown``, the same
for each round) and the SST files on disk after it.

Two streams: ``news`` (:mod:`stream_dedup.tools.generate`, the stream of the other
benchmarks) and ``excerpts`` (``tests/excerpts.py``: the same with 20 % excerpts).
Targets (issue 31): throughput with containment >= 75 % of without; bytes <= 1.3x.

    PYTHONPATH=. .venv/bin/python bench/bench_containment.py -n 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload_dictionary import TRAIN_DOCUMENTS
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.tools.generate import StreamSpec, generate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the excerpt stream of tests/
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bytes import rocks_breakdown


def documents(stream: str, n: int) -> list[Document]:
    if stream == "news":
        return [
            Document(r["id"], r["title"] + "\n" + r["text"])
            for r in generate(StreamSpec(documents=n))
        ]
    from tests.excerpts import excerpt_stream

    s = excerpt_stream(n)
    return [Document(r["id"], c) for r, c in zip(s.records, s.contents, strict=True)]


class Run(NamedTuple):
    """One run's wall and CPU seconds (the whole process: RocksDB's threads too), over all
    of it and over the documents after the first :data:`TRAIN_DOCUMENTS` (``steady_*``),
    and the excerpts it found."""

    wall: float
    cpu: float
    steady_wall: float
    steady_cpu: float
    steady_docs: int
    excerpts: int


def run(docs: list[Document], containment: float, batch: int, where: Path) -> Run:
    """Decide ``docs`` into a fresh index at ``where``.

    The index trains its payload dictionary once, on its first documents (~0.5 s of CPU,
    :mod:`stream_dedup.dedup.dictionary`): in a run of 10,000 documents that is tens of
    microseconds per document, in a backfill of millions nothing. So besides the whole
    run, the documents after the training are timed apart: the steady state a long run
    has, on an index that grows from there.
    """
    config = DedupConfig(containment=containment)
    started, cpu = time.perf_counter(), time.process_time()
    index = open_index(where, IndexParams.of(config))
    dedup = Deduplicator(index, config)
    excerpts, warm = 0, -(-TRAIN_DOCUMENTS // batch) * batch
    steady_wall = steady_cpu = 0.0
    for at in range(0, len(docs), batch):
        if at == warm:
            steady_wall, steady_cpu = time.perf_counter(), time.process_time()
        excerpts += dedup.process(docs[at : at + batch]).stats.excerpts
    index.close()
    wall, used = time.perf_counter(), time.process_time()
    if not steady_wall:  # too few documents for a steady part: the whole run
        steady_wall, steady_cpu = started, cpu
    return Run(
        wall - started, used - cpu, wall - steady_wall, used - steady_cpu,
        len(docs) - min(warm, len(docs)) or len(docs), excerpts,
    )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", default="news,excerpts")
    args = p.parse_args()
    for stream in args.streams.split(","):
        docs = documents(stream, args.documents)
        run(docs[:2000], 0.8, args.batch, Path(tempfile.mkdtemp()) / "warm")  # kernels loaded
        rates: dict[float, list[float]] = {0.0: [], 0.8: []}
        cpu_us: dict[float, list[float]] = {0.0: [], 0.8: []}
        steady_rates: dict[float, list[float]] = {0.0: [], 0.8: []}
        steady_us: dict[float, list[float]] = {0.0: [], 0.8: []}
        sizes: dict[float, tuple[int, int]] = {}
        found = 0
        for r in range(args.rounds):
            for c in (0.0, 0.8) if r % 2 == 0 else (0.8, 0.0):
                with tempfile.TemporaryDirectory() as tmp:
                    got = run(docs, c, args.batch, Path(tmp) / "idx")
                    rates[c].append(len(docs) / got.wall)
                    cpu_us[c].append(got.cpu / len(docs) * 1e6)
                    steady_rates[c].append(got.steady_docs / got.steady_wall)
                    steady_us[c].append(got.steady_cpu / got.steady_docs * 1e6)
                    excerpts = got.excerpts
                    if c not in sizes:
                        b = rocks_breakdown(Path(tmp) / "idx")
                        kv = sum(b["keys"].values()) + sum(b["values"].values())
                        sizes[c] = (kv, b["sst_bytes"])
                    found = max(found, excerpts)
        off, on = statistics.median(rates[0.0]), statistics.median(rates[0.8])
        paired = statistics.median(a / b for a, b in zip(rates[0.8], rates[0.0], strict=True))
        cpu_off, cpu_on = statistics.median(cpu_us[0.0]), statistics.median(cpu_us[0.8])
        print(
            f"{stream}: {len(docs)} docs, {args.rounds} rounds, {found} excerpts: "
            f"off {off:,.0f} docs/s, on {on:,.0f} docs/s, ratio {on / off:.2f}, "
            f"paired ratio median {paired:.2f}; CPU per doc off {cpu_off:.0f} us, on "
            f"{cpu_on:.0f} us (throughput by CPU {cpu_off / cpu_on:.2f}) "
            f"(rounds off {[round(x) for x in rates[0.0]]}, on {[round(x) for x in rates[0.8]]}); "
            f"key+value bytes/doc off {sizes[0.0][0] / len(docs):,.0f}, "
            f"on {sizes[0.8][0] / len(docs):,.0f} ({sizes[0.8][0] / sizes[0.0][0]:.2f}x); "
            f"SST bytes/doc off {sizes[0.0][1] / len(docs):,.0f}, "
            f"on {sizes[0.8][1] / len(docs):,.0f} ({sizes[0.8][1] / sizes[0.0][1]:.2f}x)"
        )
        s_off, s_on = statistics.median(steady_rates[0.0]), statistics.median(steady_rates[0.8])
        s_paired = statistics.median(
            a / b for a, b in zip(steady_rates[0.8], steady_rates[0.0], strict=True)
        )
        s_cpu_off, s_cpu_on = statistics.median(steady_us[0.0]), statistics.median(steady_us[0.8])
        print(
            f"{stream}, after the dictionary's training ({TRAIN_DOCUMENTS:,} documents): "
            f"off {s_off:,.0f} docs/s, on {s_on:,.0f} docs/s, ratio {s_on / s_off:.2f}, paired "
            f"ratio median {s_paired:.2f}; CPU per doc off {s_cpu_off:.0f} us, on "
            f"{s_cpu_on:.0f} us (throughput by CPU {s_cpu_off / s_cpu_on:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
