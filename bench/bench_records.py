"""CPU of building a batch's records and write, the two ways, in one process.

What a shared index does inside its lease besides reading and matching: turning the
matching pass's numbers into verdicts and records (:mod:`stream_dedup.dedup.batch_writes`
list by list, or :func:`stream_dedup.dedup.writes.one_by_one` a document at a time), and
building the redo record of the write (:mod:`stream_dedup.index.redis_prepare`, band
buckets from the member arrays or from one value per bucket). Both ways run on the same
batches, alternated, on a memory index warmed with earlier batches; printed are the
medians of ``process_time`` per document. No Redis: this is the client's CPU alone, the
part of the lease that the machine's load does not blur.

    .venv/bin/python bench/bench_records.py
    .venv/bin/python bench/bench_records.py -n 8000 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from bench_service import documents

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator, writes
from stream_dedup.dedup.batch import BatchStats
from stream_dedup.index import DedupIndex
from stream_dedup.index.backend import OrderedPuts
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_prepare import prepare_write
from stream_dedup.models import Document

_FAST = writes.decided_once


def _slow(docs: Sequence[Document], *rest: object) -> object:
    return writes.one_by_one(docs, *rest, BatchStats())  # type: ignore[arg-type]


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=8000)
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    config = DedupConfig()
    dedup = Deduplicator(DedupIndex(MemoryBackend(), IndexParams.of(config)), config)
    dedup.warm_up()
    raw = documents(args.documents, 0)
    docs = [Document(d["id"], d["text"]) for d in raw]
    *warm, batch = [docs[i : i + args.batch] for i in range(0, len(docs), args.batch)]
    for part in warm:
        dedup.process(part)
    sk = dedup.sketch(batch)
    times: dict[str, list[float]] = {
        k: [] for k in ("decide old", "decide new", "write old", "write new")
    }
    for _ in range(args.rounds):
        for name, fn in (("decide old", _slow), ("decide new", _FAST)):
            writes.decided_once = fn  # type: ignore[assignment]
            times[name].append(_cpu(lambda: dedup.decide(batch, sk)))
        writes.decided_once = _FAST
        result = dedup.decide(batch, sk)
        puts = dict(result.puts)  # the records; the counters and points are a few keys more
        plain = OrderedPuts(result.bucket_puts.keys, result.bucket_puts.values)
        for name, ordered in (("write old", plain), ("write new", result.bucket_puts)):
            times[name].append(_cpu(lambda o=ordered, p=puts: prepare_write(p, o, 1, None)))
    per_doc = {k: statistics.median(v) / len(batch) * 1e6 for k, v in times.items()}
    print(
        f"{len(batch)} documents after {len(warm) * args.batch}, medians of {args.rounds} "
        "(µs of CPU per document): " + ", ".join(f"{k} {v:.1f}" for k, v in per_doc.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
