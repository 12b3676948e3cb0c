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

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.tools.generate import StreamSpec, generate

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


def run(
    docs: list[Document], containment: float, batch: int, where: Path
) -> tuple[float, float, int]:
    """Wall and CPU seconds (the whole process: RocksDB's threads too) to decide ``docs``
    into a fresh index at ``where``, and its excerpts."""
    config = DedupConfig(containment=containment)
    started, cpu = time.perf_counter(), time.process_time()
    index = open_index(where, IndexParams.of(config))
    dedup = Deduplicator(index, config)
    excerpts = 0
    for at in range(0, len(docs), batch):
        excerpts += dedup.process(docs[at : at + batch]).stats.excerpts
    index.close()
    return time.perf_counter() - started, time.process_time() - cpu, excerpts


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
        sizes: dict[float, tuple[int, int]] = {}
        found = 0
        for r in range(args.rounds):
            for c in (0.0, 0.8) if r % 2 == 0 else (0.8, 0.0):
                with tempfile.TemporaryDirectory() as tmp:
                    took, cpu, excerpts = run(docs, c, args.batch, Path(tmp) / "idx")
                    rates[c].append(len(docs) / took)
                    cpu_us[c].append(cpu / len(docs) * 1e6)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
