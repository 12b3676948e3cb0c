"""Offline speed: stream-dedup against datasketch and rensa, in one process, same documents.

Two measurements, each repeated (repetitions interleaved across libraries) and reported as
the median:

1. **signatures**: normalised text -> 128-value MinHash signature. datasketch
   (``MinHash.update_batch`` over the UTF-8 encoded char 5-gram list), rensa
   (``RMinHash.update`` over the list of 5-gram strings: building that Python list is part of
   rensa's cost) and stream-dedup (:func:`stream_dedup.core.sketch.sketch` in batches, the
   path ``Deduplicator.decide`` takes: normalise, shingle, sign, plus band keys and the
   exact-text digest, which the peers do not compute). The peers pay for
   :func:`stream_dedup.core.normalize.normalize`; stream-dedup normalises inside its sketch.
2. **pipeline**: every document decided against those before it. datasketch
   (``MinHashLSH(threshold=0.8)``, query then insert), rensa (``RMinHashLSH(threshold=0.8,
   num_bands=16)`` in memory, query then insert) and stream-dedup's offline path as
   ``stream-dedup dedup --index`` runs it: a :class:`~stream_dedup.dedup.Deduplicator` over a
   fresh RocksDB index (write-ahead log on) with exact Jaccard verification, in batches,
   timed from opening the index to closing it.

datasketch is slow, so it runs on the first ``--datasketch-docs`` documents only; docs/s is
comparable, the absolute time is not. The peers' "duplicates" are documents whose LSH query
returned any candidate (they verify nothing); stream-dedup's are verified verdicts.

Targets (issue 2): signatures >= 3x rensa; pipeline >= 1.5x rensa and >= 5x datasketch.

    .venv/bin/python bench/bench_offline.py            # what `make bench` runs
    .venv/bin/python bench/bench_offline.py -n 20000 --repeats 7 --json out/bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from datasketch import MinHash, MinHashLSH
from rensa import RMinHash, RMinHashLSH

from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.normalize import normalize
from stream_dedup.core.sketch import sketch
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.malloc_tuning import keep_freed_memory
from stream_dedup.models import Document
from stream_dedup.tools.generate import StreamSpec, generate

K = 5
NUM_PERM = 128
THRESHOLD = 0.8
SEED = 1
RENSA_BANDS = 16

#: A benchmarked function: documents and a fresh scratch directory -> duplicates found (or None)
Bench = Callable[[Sequence[Document], str], int | None]

#: (task, library, function, documents, note) of one measurement
Planned = tuple[str, str, Bench, list[Document], str]

#: (what, minimum ratio ours / theirs)
TARGETS = {
    ("signatures", "rensa"): 3.0,
    ("pipeline", "rensa"): 1.5,
    ("pipeline", "datasketch"): 5.0,
}


@dataclass(slots=True)
class Measurement:
    """One library on one task: median docs/s over the repetitions."""

    task: str
    library: str
    documents: int
    seconds: list[float]
    duplicates: int | None = None
    note: str = ""

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def docs_per_s(self) -> float:
        return self.documents / self.median_seconds


@dataclass(slots=True)
class Report:
    environment: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)

    def get(self, task: str, library: str) -> Measurement:
        return next(m for m in self.measurements if m.task == task and m.library == library)

    def ratio(self, task: str, theirs: str) -> float:
        return self.get(task, "stream-dedup").docs_per_s / self.get(task, theirs).docs_per_s


# --- the peers: a Python list of char 5-grams per document --------------------------------


def char_grams(text: str) -> list[str]:
    """Char 5-grams of a normalised text (a non-empty text shorter than k is one gram)."""
    if len(text) < K:
        return [text] if text else []
    return [text[i : i + K] for i in range(len(text) - K + 1)]


def datasketch_minhash(content: str) -> MinHash:
    m = MinHash(num_perm=NUM_PERM, seed=SEED)
    m.update_batch([g.encode("utf-8") for g in char_grams(normalize(content))])
    return m


def rensa_minhash(content: str) -> RMinHash:
    m = RMinHash(num_perm=NUM_PERM, seed=SEED)
    m.update(char_grams(normalize(content)))
    return m


def datasketch_signatures(docs: Sequence[Document], workdir: str) -> int | None:
    for d in docs:
        datasketch_minhash(d.content)
    return None


def rensa_signatures(docs: Sequence[Document], workdir: str) -> int | None:
    for d in docs:
        rensa_minhash(d.content)
    return None


def datasketch_pipeline(docs: Sequence[Document], workdir: str) -> int:
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    dups = 0
    for d in docs:
        m = datasketch_minhash(d.content)
        dups += bool(lsh.query(m))
        lsh.insert(d.id, m)
    return dups


def rensa_pipeline(docs: Sequence[Document], workdir: str) -> int:
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=RENSA_BANDS)
    dups = 0
    for key, d in enumerate(docs):
        m = rensa_minhash(d.content)
        dups += bool(lsh.query(m))
        lsh.insert(key, m)
    return dups


# --- stream-dedup -------------------------------------------------------------------------


def ours_signatures(docs: Sequence[Document], batch_size: int) -> int | None:
    """The sketch ``Deduplicator.decide`` starts with, in batches, from raw content.

    Normalise, shingle and sign, plus what the peers do not do: band keys and the
    exact-text digest (``verify = "signature"``, so no verification sets).
    """
    config = DedupConfig(
        threshold=THRESHOLD, num_perm=NUM_PERM, seed=SEED, shingle_size=K,
        verify="signature",
    )  # fmt: skip
    plan = config.band_plan()
    for lo in range(0, len(docs), batch_size):
        sketch([d.content for d in docs[lo : lo + batch_size]], config, plan)
    return None


def ours_pipeline(docs: Sequence[Document], workdir: str, batch_size: int) -> int:
    """``stream-dedup dedup --index`` on a fresh RocksDB index in ``workdir``."""
    config = DedupConfig(threshold=THRESHOLD, num_perm=NUM_PERM, seed=SEED, verify="exact")
    dups = 0
    index = open_index(workdir, IndexParams.of(config))
    try:
        dedup = Deduplicator(index, config)
        for lo in range(0, len(docs), batch_size):
            result = dedup.process(docs[lo : lo + batch_size])
            dups += sum(v.is_duplicate for v in result.verdicts)
    finally:
        index.close()
    return dups


# --- harness ------------------------------------------------------------------------------


def timed_run(fn: Bench, docs: Sequence[Document]) -> tuple[float, int | None]:
    """Seconds for one run of ``fn`` on ``docs`` in a fresh scratch directory, and its result.

    The directory is created and removed outside the clock.
    """
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        start = time.perf_counter()
        dups = fn(docs, tmp)
        return time.perf_counter() - start, dups


def measure_all(plan: Sequence[Planned], repeats: int) -> list[Measurement]:
    """Every planned measurement, ``repeats`` times, interleaved.

    Each function first runs once on a few documents (imports, caches, allocator). Then the
    repetitions go round the whole plan (rep 1 of everything, rep 2, ...), so a change in
    the machine's load during the run affects every library alike instead of one of them.
    """
    out = [
        Measurement(task, library, len(docs), [], None, note)
        for task, library, _, docs, note in plan
    ]
    for _, _, fn, docs, _ in plan:
        timed_run(fn, docs[: min(200, len(docs))])
    for rep in range(repeats):
        for (task, library, fn, docs, _), m in zip(plan, out, strict=True):
            elapsed, m.duplicates = timed_run(fn, docs)
            m.seconds.append(elapsed)
            print(
                f"  rep {rep + 1}/{repeats} {task:<10} {library:<12} {elapsed:6.2f} s "
                f"({len(docs) / elapsed:,.0f} docs/s)",
                file=sys.stderr,
                flush=True,
            )
    return out


def load_documents(n: int, seed: int) -> list[Document]:
    return [
        Document(r["id"], r["title"] + "\n" + r["text"])
        for r in generate(StreamSpec(documents=n, seed=seed))
    ]


def environment(args: argparse.Namespace, docs: Sequence[Document]) -> dict[str, Any]:
    sizes = [len(d.content.encode("utf-8")) for d in docs]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "datasketch": version("datasketch"),
        "rensa": version("rensa"),
        "rocksdict": version("rocksdict"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "documents": len(docs),
        "datasketch_documents": min(args.datasketch_docs, len(docs)),
        "mean_document_bytes": round(sum(sizes) / len(sizes)),
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "stream_seed": args.seed,
    }


def run(args: argparse.Namespace) -> Report:
    print(f"generating {args.documents} documents ...", file=sys.stderr, flush=True)
    docs = load_documents(args.documents, args.seed)
    subset = docs[: args.datasketch_docs]
    report = Report(environment(args, docs))
    sub_note = f"first {len(subset)} documents"
    bs = args.batch_size
    keep_freed_memory()  # as the command line does
    # Load (or compile, on the first run after an install) the sketch kernels outside
    # the timings, as the peers' native code is loaded at import (compiled: 50 documents
    # would otherwise take the Python path and load nothing).
    with tempfile.TemporaryDirectory() as warm, jit.forced(True):
        ours_pipeline(docs[:50], warm, bs)
    plan: list[Planned] = [
        ("signatures", "datasketch", datasketch_signatures, subset, sub_note),
        ("signatures", "rensa", rensa_signatures, docs, ""),
        ("signatures", "stream-dedup", lambda d, _: ours_signatures(d, bs), docs, ""),
        ("pipeline", "datasketch", datasketch_pipeline, subset, sub_note),
        ("pipeline", "rensa", rensa_pipeline, docs, "in memory"),
        ("pipeline", "stream-dedup", lambda d, w: ours_pipeline(d, w, bs), docs, "RocksDB + exact"),
    ]
    report.measurements = measure_all(plan, args.repeats)
    return report


def render(report: Report) -> str:
    env = report.environment
    lines = [
        f"stream-dedup offline benchmark, {env['date']}",
        f"Python {env['python']}, numpy {env['numpy']}, datasketch {env['datasketch']}, "
        f"rensa {env['rensa']}, rocksdict {env['rocksdict']}",
        f"{env['platform']}, {env['cpus']} CPUs ({env['cpus_usable']} usable)",
        f"N = {env['documents']} synthetic news documents (mean {env['mean_document_bytes']} "
        f"bytes), char {K}-grams, K = {NUM_PERM}, T = {THRESHOLD}; median of "
        f"{env['repeats']} runs; stream-dedup in batches of {env['batch_size']}",
        f"datasketch runs on the first {env['datasketch_documents']} documents only (slow); "
        "its docs/s is comparable, its duplicate count is not",
        "",
        f"{'task':<11}{'library':<14}{'docs':>7}{'median s':>10}{'docs/s':>10}{'dups':>7}  note",
    ]
    for m in report.measurements:
        dups = "" if m.duplicates is None else str(m.duplicates)
        lines.append(
            f"{m.task:<11}{m.library:<14}{m.documents:>7}{m.median_seconds:>10.3f}"
            f"{m.docs_per_s:>10,.0f}{dups:>7}  {m.note}"
        )
    lines += [
        "",
        "dups: datasketch/rensa count documents whose LSH query returned any candidate "
        "(unverified); stream-dedup counts verified duplicates (Jaccard >= T)",
        "",
        "ratios (stream-dedup docs/s / theirs):",
    ]
    for task in ("signatures", "pipeline"):
        for theirs in ("rensa", "datasketch"):
            ratio = report.ratio(task, theirs)
            target = TARGETS.get((task, theirs))
            verdict = (
                ""
                if target is None
                else (f"  target >= {target:g}x  {'PASS' if ratio >= target else 'MISS'}")
            )
            lines.append(f"  {task:<11} ours/{theirs:<11}{ratio:7.2f}x{verdict}")
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    ratios = {
        f"{task}/{theirs}": round(report.ratio(task, theirs), 3)
        for task in ("signatures", "pipeline")
        for theirs in ("rensa", "datasketch")
    }
    return {
        "environment": report.environment,
        "measurements": [
            {**asdict(m), "median_seconds": m.median_seconds, "docs_per_s": m.docs_per_s}
            for m in report.measurements
        ],
        "ratios": ratios,
        "targets": {
            f"{task}/{theirs}": {"min": target, "pass": ratios[f"{task}/{theirs}"] >= target}
            for (task, theirs), target in TARGETS.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark stream-dedup's signatures and offline pipeline against "
        "datasketch and rensa on the same synthetic ~1 KB news documents (median docs/s).",
    )
    parser.add_argument("-n", "--documents", type=int, default=8000, help="documents (8000)")
    parser.add_argument(
        "--datasketch-docs",
        type=int,
        default=1000,
        help="documents datasketch runs on, a prefix of the stream (1000)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per measurement (5)")
    parser.add_argument("--batch-size", type=int, default=1000, help="stream-dedup batch (1000)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated stream (7)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.documents < 1 or args.datasketch_docs < 1 or args.repeats < 1:
        parser.error("--documents, --datasketch-docs and --repeats must be positive")
    report = run(args)
    print(render(report))
    if args.json:
        with Path(args.json).open("w", encoding="utf-8") as f:
            json.dump(to_json(report), f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
