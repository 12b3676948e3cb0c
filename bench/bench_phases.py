"""Where the deciding thread's CPU goes on a grown index: CPU per document of each step of
deciding and committing a batch, over the later documents of one stream.

``bench_growth.py`` gives the deciding thread's CPU per document as one figure; this script
splits it by step. It decides ``-n`` generated news-like documents (the stream of
``bench_growth.py``) into a RocksDB index in a temporary directory, batches of 2,000, and
counts, for the batches from ``--start`` documents on, the thread CPU (``time.thread_time``)
spent in each step :meth:`~stream_dedup.dedup.Deduplicator.decide` and ``commit`` call:
reading what the index knows and holds, the verification payloads (sets rebuilt from text,
``rebuild``/``decode``), the matching pass, verdicts and writes, the set cache's
bookkeeping (``remember``), the bucket writes, and the index's prepare and apply. Steps
are found by name in the module that calls them; those a version lacks are left out, so
the script runs against older checkouts too (``PYTHONPATH=<checkout>``).

    .venv/bin/python bench/bench_phases.py -n 100000 --start 50000
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stream_dedup.dedup.deduplicator as deciding
from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import parse_time
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.malloc_tuning import keep_freed_memory
from stream_dedup.models import Document
from stream_dedup.service import gc_tuning
from stream_dedup.tools.generate import StreamSpec, generate

spent: Counter[str] = Counter()
counting = [False]


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` with a wrapper adding its thread CPU to ``spent[label]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            if counting[0]:
                spent[label] += time.thread_time() - started

    setattr(owner, name, wrapper)


def instrument() -> None:
    """Wrap every step this checkout has."""
    steps = ["read_known", "read_held", "payloads", "match_batch", "verdicts_and_writes"]
    for name in [*steps, "bucket_puts"]:
        if hasattr(deciding, name):
            timed(deciding, name, name)
    if hasattr(deciding.Deduplicator, "_remember"):
        timed(deciding.Deduplicator, "_remember", "remember")
    try:
        import stream_dedup.core.set_cache as cache_module
    except ImportError:  # a checkout from before the cache by generation
        import stream_dedup.core.payload as cache_module
    for name in ("payload_sets", "rebuild_flat", "rebuild_sets"):
        if hasattr(cache_module, name):
            timed(cache_module, name, "rebuild")
    if hasattr(cache_module, "decode_text"):
        timed(cache_module, "decode_text", "decode")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=100_000)
    p.add_argument("--start", type=int, default=50_000, help="count from this document on")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args()
    instrument()
    keep_freed_memory()
    config = DedupConfig()
    stream = generate(StreamSpec(documents=args.documents, seed=7))
    with tempfile.TemporaryDirectory(prefix="bench-phases-") as tmp:
        index = open_index(Path(tmp) / "index", IndexParams.of(config))
        timed(index, "prepare", "index.prepare")
        timed(index, "apply", "index.apply")
        dedup = deciding.Deduplicator(index, config)
        dedup.warm_up()
        done = 0
        gc_tuning.enter()
        try:
            while batch := list(itertools.islice(stream, 2000)):
                docs = [
                    Document(r["id"], r["title"] + "\n\n" + r["text"], parse_time(r["published"]))
                    for r in batch
                ]
                sketched = dedup.sketch(docs)
                gc_tuning.collect_due()
                counting[0] = done >= args.start
                started = time.thread_time()
                result = dedup.decide(docs, sketched)
                dedup.commit(result, {("bench", 0): done + len(docs)})
                if counting[0]:
                    spent["total"] += time.thread_time() - started
                done += len(docs)
        finally:
            gc_tuning.leave()
            index.close()
    counted = max(1, args.documents - args.start)
    out: dict[str, float] = {k: round(v * 1e6 / counted, 2) for k, v in spent.items()}
    cache = getattr(dedup, "set_cache", None)
    if cache is not None:
        out["sets_asked_per_doc"] = round(cache.asked / args.documents, 3)
        out["sets_rebuilt_per_doc"] = round(cache.rebuilt / args.documents, 3)
    for k, v in out.items():
        print(f"{k:>22} {v:>8}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
