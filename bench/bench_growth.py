"""How the cost of a document grows with the index: CPU per document, interval by interval.

The service benchmark (``bench_service.py``) sees the first 50,000 documents of an index;
a service runs for months. This script decides one long news-like stream
(:mod:`stream_dedup.tools.generate`, ~1.3 KB articles, ~45% re-runs) through the offline path
(a :class:`~stream_dedup.dedup.Deduplicator` over a RocksDB index on disk, write-ahead
log on, batches of ``--batch``) and prints, for every ``--every`` documents:

* ``main``: CPU of this thread per document for deciding and committing (reads, verdicts,
  the atomic write), the service main thread's index work;
* ``background``: CPU of every other thread of the process per document: RocksDB's flushes
  and compactions;
* candidates and verifications per document, and the index's size on disk;
* ``hit``/``rebuilt``/``skipped``: the share of candidates' verification sets found in the set cache
  (:class:`~stream_dedup.core.set_cache.SetCache`, sized with ``--set-cache-mb``) and the
  sets rebuilt from compressed text per document; ``skipped``: candidates per document
  whose set was not needed, their text too short to reach the threshold
  (:mod:`stream_dedup.dedup.prune`).

Sketching is done here too but not counted (the service does it in its worker process).
CPU is read per thread from ``/proc`` (Linux), so other load on the machine inflates the
figures less than wall time, but does not leave them untouched: compare runs taken
alternately, and medians.

With ``--max-documents N`` or ``--retention DURATION`` the index holds a window
(:mod:`stream_dedup.index.retention`; the generated records are 30 s apart on their
``published`` time, so ``--retention 833h`` is 100,000 documents): once the window is
full, size and cost per document should stop growing. Columns ``held`` and ``epochs`` show
the window; ``rss MB`` the process's resident memory.

    .venv/bin/python bench/bench_growth.py                  # 300,000 documents
    .venv/bin/python bench/bench_growth.py -n 100000 --every 25000 --json out/growth.json
    .venv/bin/python bench/bench_growth.py -n 1000000 --every 100000 --max-documents 100000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import parse_time
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention, parse_duration
from stream_dedup.malloc_tuning import keep_freed_memory
from stream_dedup.models import Document
from stream_dedup.service import gc_tuning
from stream_dedup.tools.generate import StreamSpec, generate

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def other_threads_cpu() -> float:
    """CPU seconds of every thread of this process but the calling one (from /proc)."""
    me = str(threading.get_native_id())
    total = 0
    for task in Path("/proc/self/task").iterdir():
        if task.name == me:
            continue
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def rss_bytes() -> int:
    """Resident memory of this process (from /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=300_000)
    p.add_argument("--every", type=int, default=50_000, help="documents per reported interval")
    p.add_argument("--batch", type=int, default=2000, help="documents per batch (2000)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--index-dir", help="where the index is built (default: a temporary dir)")
    p.add_argument("--json", metavar="FILE", help="also write the intervals as JSON")
    p.add_argument("--max-documents", type=int, default=0, help="hold the newest N (0: all)")
    p.add_argument("--retention", default="none", help="hold this long on the records' time")
    p.add_argument(
        "--set-cache-mb", type=int, default=0, help="verification set cache size (0: default)"
    )
    args = p.parse_args()
    if not sys.platform.startswith("linux"):
        p.error("per-thread CPU is read from /proc: Linux only")
    if args.every % args.batch:
        p.error("--every must be a multiple of --batch")

    keep_freed_memory()  # as the service process does
    config = DedupConfig()
    stream = generate(StreamSpec(documents=args.documents, seed=args.seed))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        path = Path(args.index_dir or tmp) / "index"
        retention = Retention(parse_duration(args.retention), args.max_documents)
        index = open_index(path, IndexParams.of(config), retention=retention)
        dedup = Deduplicator(index, config)
        # A checkout from before the payload (format 2, ``PYTHONPATH``) has no set cache.
        cache = getattr(dedup, "set_cache", None)
        if cache is None:  # not `or`: an empty SetCache is falsy (it has a length)
            cache = SimpleNamespace(asked=0, rebuilt=0)
        if args.set_cache_mb:
            cache.max_bytes = args.set_cache_mb << 20
        dedup.warm_up()
        print(
            f"{'documents':>10} {'main us/doc':>12} {'background':>11} {'candidates':>11} "
            f"{'verified':>9} {'index MB':>9} {'held':>9} {'epochs':>6} {'rss MB':>7} "
            f"{'hit':>6} {'rebuilt':>8} {'skipped':>8}"
        )
        done = 0
        main_cpu = candidates = verified = 0.0
        started = time.time()
        last_other, last_main = other_threads_cpu(), 0.0
        last_asked = last_rebuilt = last_skipped = 0
        gc_tuning.enter()
        try:
            while batch := list(itertools.islice(stream, args.batch)):
                docs = [
                    Document(r["id"], r["title"] + "\n\n" + r["text"], parse_time(r["published"]))
                    for r in batch
                ]
                sketched = dedup.sketch(docs)
                gc_tuning.collect_due()
                cpu = time.thread_time()
                result = dedup.decide(docs, sketched)
                dedup.commit(result, {("bench", 0): done + len(docs)})
                main_cpu += time.thread_time() - cpu
                candidates += sum(result.stats.candidates)
                verified += sum(result.stats.verifications)
                done += len(docs)
                if done % args.every == 0 or done == args.documents:
                    n = done - (rows[-1]["documents"] if rows else 0)
                    other = other_threads_cpu()
                    row = {
                        "documents": done,
                        "main_us_per_doc": round((main_cpu - last_main) * 1e6 / n, 1),
                        "background_us_per_doc": round((other - last_other) * 1e6 / n, 1),
                        "candidates_per_doc": round(candidates / n, 2),
                        "verifications_per_doc": round(verified / n, 2),
                        "index_mb": round(index.size_bytes() / 1e6, 1),
                        "held": index.stats().held,
                        "epochs": len(index.timeline.epochs),
                        "rss_mb": round(rss_bytes() / 1e6),
                        "elapsed_s": round(time.time() - started, 1),
                        "set_cache_hit": round(
                            1 - (cache.rebuilt - last_rebuilt) / max(1, cache.asked - last_asked),
                            3,
                        ),
                        "rebuilt_per_doc": round((cache.rebuilt - last_rebuilt) / n, 2),
                        "skipped_per_doc": round(
                            (getattr(cache, "skipped", 0) - last_skipped) / n, 2
                        ),
                    }
                    last_asked, last_rebuilt = cache.asked, cache.rebuilt
                    last_skipped = getattr(cache, "skipped", 0)
                    rows.append(row)
                    last_other, last_main, candidates, verified = other, main_cpu, 0.0, 0.0
                    print(
                        f"{row['documents']:>10,} {row['main_us_per_doc']:>12} "
                        f"{row['background_us_per_doc']:>11} {row['candidates_per_doc']:>11} "
                        f"{row['verifications_per_doc']:>9} {row['index_mb']:>9} "
                        f"{row['held']:>9,} {row['epochs']:>6} {row['rss_mb']:>7} "
                        f"{row['set_cache_hit']:>6} {row['rebuilt_per_doc']:>8} "
                        f"{row['skipped_per_doc']:>8}",
                        flush=True,
                    )
        finally:
            gc_tuning.leave()
            index.close()
    if args.json:
        out = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "batch": args.batch,
            "retention": retention.describe(),
            "intervals": rows,
        }
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
