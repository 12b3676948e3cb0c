"""The compiled matching pass alone: ``match_batch`` timed on a fixed, recorded workload.

A stream is decided once through the offline path (a
:class:`~stream_dedup.dedup.Deduplicator` over an in-memory index) while every call of
``match_batch`` is recorded with a copy of its inputs; the recorded calls are then
replayed ``--repeats`` times and the median time of a replay is printed, per document
too. Nothing else is timed: no sketching, index reads or verdicts. The pass does not
change its inputs, so every replay does the same work.

Two workloads: ``news``, ``-n`` generated ~1.3 KB news articles
(:mod:`stream_dedup.tools.generate`, ~45% re-runs, so many candidates are verified), and
``kijiji``, the 2,627 real rental ads of ``tests/data`` (reposts and near-reposts). Both
use the default detector settings (exact verification) unless ``--verify signature``.

To compare two versions of the package, run this script alternately against each (for
example with ``PYTHONPATH`` pointing at the other checkout) and compare medians; the
first line of the output names the ``match`` module that was measured. ``first call`` is
the first ``match_batch`` of the run: loading the kernel from numba's cache, or compiling
it when the cache is empty (``NUMBA_CACHE_DIR`` pointing at an empty folder).

    .venv/bin/python bench/bench_match.py
    .venv/bin/python bench/bench_match.py --workload kijiji --repeats 15 --json out/match.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import stream_dedup.dedup.deduplicator as dedup_module
from stream_dedup.core import match
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.tools.generate import StreamSpec, generate

#: The ads in this checkout's test data (tests/data/README.md).
KIJIJI = Path(__file__).resolve().parents[1] / "tests" / "data" / "kijiji_rent_rome.tsv.gz"


def news(n: int) -> list[Document]:
    """``n`` generated news articles, title and text."""
    return [
        Document(r["id"], f"{r['title']}\n\n{r['text']}") for r in generate(StreamSpec(documents=n))
    ]


def kijiji() -> list[Document]:
    """The ads, Title + " " + Short Description, in file order (as tests/corpus.py reads
    them)."""
    with gzip.open(KIJIJI, "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    header, rows = lines[0].split("\t"), [row for row in lines[1:] if row]
    title, desc = header.index("Title"), header.index("Short Description")
    docs = []
    for i, row in enumerate(rows):
        fields = row.split("\t")
        docs.append(Document(f"k{i}", fields[title] + " " + fields[desc]))
    return docs


def _copied(value: Any) -> Any:
    """A deep enough copy of one ``match_batch`` argument: arrays, tuples of them, Expiry."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    if isinstance(value, match.Expiry):
        return match.Expiry(
            value.doc_clock.copy(),
            value.points_doc.copy(),
            value.points_clock.copy(),
            value.window,
            value.max_documents,
            value.new_epoch,
        )
    return value


def record(docs: list[Document], config: DedupConfig, batch: int) -> tuple[list[Any], float]:
    """Every ``match_batch`` call of deciding ``docs`` in batches of ``batch``, and how long
    the first call took."""
    calls: list[dict[str, Any]] = []
    first: list[float] = []
    real: Callable[..., match.Matches] = match.match_batch

    def recorder(**kwargs: Any) -> match.Matches:
        calls.append({k: _copied(v) for k, v in kwargs.items()})
        start = time.perf_counter()
        out = real(**kwargs)
        if not first:
            first.append(time.perf_counter() - start)
        return out

    dedup_module.match_batch = recorder  # what the deduplicator calls
    try:
        d = Deduplicator(open_index(None, IndexParams.of(config)), config)
        for at in range(0, len(docs), batch):
            d.process(docs[at : at + batch])
    finally:
        dedup_module.match_batch = real
    return calls, first[0]


def replay(calls: list[dict[str, Any]]) -> float:
    """Seconds to run every recorded call once."""
    start = time.perf_counter()
    for kwargs in calls:
        match.match_batch(**kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("news", "kijiji"), default="news")
    parser.add_argument("-n", "--documents", type=int, default=20_000, help="news (20000)")
    parser.add_argument("--batch-size", type=int, default=1000, help="documents a batch (1000)")
    parser.add_argument("--verify", choices=("exact", "signature"), default="exact")
    parser.add_argument("--repeats", type=int, default=9, help="replays, median taken (9)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    print(f"match module: {match.__file__}", file=sys.stderr)
    docs = news(args.documents) if args.workload == "news" else kijiji()
    config = DedupConfig(verify=args.verify)
    calls, first = record(docs, config, args.batch_size)
    live = sum(len(c["fresh"]) for c in calls)
    replay(calls)  # touch every input once before timing
    times = [replay(calls) for _ in range(args.repeats)]
    median = statistics.median(times)
    print(
        f"{args.workload} ({len(docs)} docs, {live} live, {len(calls)} calls, "
        f"verify {args.verify}): median {median * 1e3:.1f} ms, "
        f"{median / live * 1e6:.2f} us/doc over {args.repeats} replays "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}); first call {first:.2f} s"
    )
    if args.json:
        result = {
            "workload": args.workload,
            "documents": len(docs),
            "live": live,
            "calls": len(calls),
            "verify": args.verify,
            "seconds": times,
            "median_seconds": median,
            "first_call_seconds": first,
            "module": match.__file__,
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
