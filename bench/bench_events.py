"""CPU of a batch's two halves in the service: deciding it, and building its events.

The shared index's strategy holds the lease for :meth:`Decider.decide` (verdicts and the
index write) and builds the events after it (:meth:`Decider.records`: a JSON value and
headers per document, the document's JSON spliced in). Before 2026-11-26 the lease held
both. This times each half on the same batches of generated news, decided against a
memory index, as the service decides them (``output.include_document`` on, the default);
printed are the medians of ``process_time`` per document, the first two batches not
counted (kernels, caches). No Redis, no broker: the client's CPU alone.

    .venv/bin/python bench/bench_events.py
    .venv/bin/python bench/bench_events.py -n 20000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_service import documents
from prometheus_client import CollectorRegistry

from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from stream_dedup.service.config_loading import build_config
from stream_dedup.service.decide import Decider
from stream_dedup.service.events import Source
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.metrics import Metrics

_STAMP = 1_700_000_000_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=16_000)
    p.add_argument("--batch", type=int, default=2000, help="documents per batch (2000)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:  # the settings need an index path
        cfg = build_config([{"input": {"topics": ["in"]}, "index": {"path": str(Path(tmp))}}])
    dedup = Deduplicator(DedupIndex(MemoryBackend(), IndexParams.of(cfg.dedup)), cfg.dedup)
    dedup.warm_up()
    decider = Decider(cfg, dedup, Metrics(CollectorRegistry()))
    raw = documents(args.documents, 0)
    deciding: list[float] = []
    building: list[float] = []
    for b, at in enumerate(range(0, len(raw), args.batch)):
        part = raw[at : at + args.batch]
        docs = [Document(d["id"], d["text"]) for d in part]
        sources = [
            Source("in", 0, at + n, _STAMP + n, d["id"].encode(), json.dumps(d).encode(), [])
            for n, d in enumerate(part)
        ]
        batch = Decoded([], docs, sources, [])
        sketched = dedup.sketch(docs)  # the sketch worker's part, outside the lease
        started = time.process_time()
        decision = decider.decide(batch, sketched)
        decided = time.process_time()
        decider.records(batch, decision)
        built = time.process_time()
        dedup.after_lease()
        if b >= 2:
            deciding.append((decided - started) / len(part) * 1e6)
            building.append((built - decided) / len(part) * 1e6)
    print(
        f"deciding {statistics.median(deciding):.1f} us/doc (in the lease), building the "
        f"events {statistics.median(building):.1f} us/doc (after it); batches counted "
        f"{len(deciding)}: deciding {[round(x, 1) for x in deciding]}, events "
        f"{[round(x, 1) for x in building]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
