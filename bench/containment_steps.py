"""Containment's steps by thread CPU: where a containment-on document's time goes.

Process CPU per document (``bench_containment.py``, ``pair_containment.py``) spreads by
tens of µs between runs of the same code on a shared host; a step's thread CPU
(``time.thread_time`` around it) moves far less, so a cut of a few µs shows here first.
Decides ``-n`` documents of one stream into a fresh RocksDB index in batches of 1,000 with
``containment = 0.8`` (after a warm-up run), and prints each step's thread CPU per
document over the documents after the payload dictionary's training: the bucket reads,
the sampled buckets' reads (where the tree has them apart), verification, sampling, the
vote, the held buckets, the sampled buckets' puts, ``add_relations``, ``find_excerpts`` in
all, and ``decide`` and ``commit``. Steps a tree lacks are left out, so it runs against
other checkouts too (``PYTHONPATH=<checkout>``, run from that checkout).

    PYTHONPATH=. .venv/bin/python bench/containment_steps.py news
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import stream_dedup.dedup.deduplicator as deciding
import stream_dedup.dedup.excerpts as excerpts
import stream_dedup.dedup.writes as writes
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload_dictionary import TRAIN_DOCUMENTS
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex, open_index
from stream_dedup.index.params import IndexParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_containment
import bench_phases
from bench_phases import counting, spent


def timed(owner: Any, name: str) -> None:
    """``bench_phases.timed`` under the step's own name, where this checkout has it."""
    if hasattr(owner, name):
        bench_phases.timed(owner, name, name)


def instrument() -> None:
    for name in ("read_sampled_members", "read_bucket_members"):
        timed(DedupIndex, name)
    for name in ("_bucket_puts", "_verify", "vote", "sample_unknown", "held_buckets"):
        timed(excerpts, name)
    timed(writes, "add_relations")
    timed(deciding, "find_excerpts")
    timed(Deduplicator, "decide")
    timed(Deduplicator, "commit")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stream", choices=["news", "excerpts"])
    p.add_argument("-n", "--documents", type=int, default=10_000)
    args = p.parse_args()
    instrument()
    docs = bench_containment.documents(args.stream, args.documents)
    config = DedupConfig(containment=0.8)
    with tempfile.TemporaryDirectory() as tmp:
        bench_containment.run(docs[:2000], 0.8, 1000, Path(tmp) / "warm")  # kernels loaded
        index = open_index(Path(tmp) / "index", IndexParams.of(config))
        dedup = Deduplicator(index, config)
        for at in range(0, len(docs), 1000):
            counting[0] = at >= TRAIN_DOCUMENTS
            dedup.process(docs[at : at + 1000])
        counted = len(docs) - TRAIN_DOCUMENTS
        steps = " ".join(f"{k}={v / counted * 1e6:.2f}" for k, v in sorted(spent.items()))
        print(f"{args.stream}: µs per document: {steps}")
        cache = getattr(index, "_sampled", None)
        if cache is not None:
            n = len(docs)
            print(f"sampled keys per document: asked {cache.asked / n:.2f}, "
                  f"answered from memory {cache.answered / n:.2f}")  # fmt: skip
        index.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
