"""Time a shared Redis index's lease, phase by phase, without a broker.

``--instances`` index objects (each its own connection, as separate service instances
have) take turns on one index: each batch is sketched outside the lease (the service's
worker does that) and decided before it (``Deduplicator.predecide``), then settled and
stored inside it exactly as the service's ``SharedIndex`` strategy does. The next holder
decides its batch before this one's lease (as under contention, when it decides while
this one holds the lease), so it learns of this batch's write only at its own lease;
printed per run: how its batches were settled (kept, docnums moved, parts decided again,
decided again whole) and the documents decided again. ``--inside`` decides inside the
lease only, as before 2026-11-26. Printed per setup (a Redis node, a 3-master cluster): the
lease held per document (what ``stream_dedup_index_lease_held_seconds`` measures), split
into taking it (with the state re-read and the writes not applied yet read), deciding
(the index reads), preparing the write and storing it up to its commit point (which lets
the lease go); the write applied after the lease; the work done before the lease per
document; the Redis CPU per document; and the ceiling that the lease puts on one index,
``1 / lease per document`` (a projection: the other work of the instances runs in
parallel). The first batch of each instance is not counted (its filter is built, its
caches are cold). With two or more instances a write is applied only after the next
batch has decided (as when another instance takes the lease at once): the next holder
reads it through its redo record, and applies it before its own write. What a batch
leaves for later batches (its sets kept in the set cache) runs after the lease, as the
service runs it (``Deduplicator.after_lease``), and is counted in "after it".

On a busy machine the wall-clock times swing with the other processes; the CPU time the
process spends inside the lease (``time.process_time``) and the Redis servers' CPU time
per document do not, and their sum is about the lease on an idle machine with Redis
near the instance.

    .venv/bin/python bench/bench_lease.py
    .venv/bin/python bench/bench_lease.py -n 40000 --instances 2 --json lease.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench_service import documents
from cpu_time import redis_cpu_s

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.predecide import PredecideCounts, Predecided
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.models import Document
from stream_dedup.tools import redis_local

PHASES = ("before", "take", "decide", "prepare", "commit", "after")
#: The phases inside the lease: the write lets it go at its commit point, and what
#: follows (applying the write) runs outside it.
HELD = ("take", "decide", "prepare", "commit")


def _marker(wall: list[float], cpu: list[float]) -> Callable[[], None]:
    """A function that appends the wall-clock and CPU time now to ``wall`` and ``cpu``."""

    def mark() -> None:
        wall.append(time.perf_counter())
        cpu.append(time.process_time())

    return mark


class _Late:
    """Makes a backend's writes, past their commit point (the lease let go), wait to be
    applied until the next batch has taken the lease and decided, as another instance's
    next batch does: the next holder reads the write through its redo record and applies
    it before its own. Calls ``mark`` where applying would have started."""

    def __init__(self, backend: RedisBackend) -> None:
        self.queue = backend._queue
        self.apply = type(self.queue).apply
        self.mark: Callable[[], None] = lambda: None
        self.waiting: list[tuple[Sequence[int], bytes]] = []
        self.defer = True

        def deferred(waiting: Sequence[int], epoch_set: bytes) -> None:
            self.mark()
            if self.defer:
                self.waiting.append((waiting, epoch_set))
            else:
                self.apply(self.queue, waiting, epoch_set)

        self.queue.apply = deferred  # type: ignore[method-assign]

    def finish(self) -> None:
        """The writes held back, applied late (most were applied by the next batch)."""
        for waiting, epoch_set in self.waiting:
            self.apply(self.queue, waiting, epoch_set)
        self.waiting.clear()


def one_run(url: str, docs: list[Document], args: argparse.Namespace, run: int) -> dict[str, Any]:
    """Phase times (seconds, summed over the counted batches) of one pass over ``docs``."""
    config = DedupConfig()
    namespace = f"bench-lease-{run}-{time.time_ns()}"
    instances = [
        Deduplicator(
            DedupIndex(RedisBackend(url, namespace=namespace), IndexParams.of(config)), config
        )
        for _ in range(args.instances)
    ]
    for dedup in instances:
        dedup.warm_up()  # the kernels load (or compile) outside any lease
    late = []
    for dedup in instances:
        assert isinstance(dedup.index._backend, RedisBackend)
        late.append(_Late(dedup.index._backend))
        late[-1].defer = args.instances > 1
    size = args.batch
    batches = [docs[i : i + size] for i in range(0, len(docs), size)]
    totals = dict.fromkeys((*PHASES, *(p + "_cpu" for p in PHASES), "lease_cpu"), 0.0)
    ahead: dict[int, tuple[Sketch, Predecided | None, float, float]] = {}

    def sketch_ahead(k: int) -> None:
        """Batch ``k`` sketched and, unless ``--inside``, decided before its lease."""
        dedup = instances[k % len(instances)]
        wall, cpu = time.perf_counter(), time.process_time()
        sketched = dedup.sketch(batches[k])
        pre = None if args.inside else dedup.predecide(batches[k], sketched)
        ahead[k] = (sketched, pre, time.perf_counter() - wall, time.process_time() - cpu)

    counted = 0
    cpu_start = 0.0
    try:
        for b, batch in enumerate(batches):
            if b == args.instances:  # every instance has warmed up
                cpu_start = redis_cpu_s(url)
            dedup = instances[b % len(instances)]
            if b not in ahead:
                sketch_ahead(b)
            if b + 1 < len(batches) and (b + 1) % len(instances) != b % len(instances):
                # The next holder decides its batch while this one waits for or holds the
                # lease: it sees this batch's write only through the log, at its lease.
                sketch_ahead(b + 1)
            sketched, pre, before_wall, before_cpu = ahead.pop(b)
            wall: list[float] = []
            cpu: list[float] = []
            mark = late[b % len(instances)].mark = _marker(wall, cpu)
            mark()
            wall.insert(0, wall[0] - before_wall)
            cpu.insert(0, cpu[0] - before_cpu)
            with dedup.index.exclusive():
                mark()
                result = None if pre is None else dedup.settle(pre)
                if result is None:
                    result = dedup.decide(batch, sketched)
                mark()
                pending = dedup.prepare(result)
                mark()
                dedup.index.apply(pending)
                mark()
            started, started_cpu = time.perf_counter(), time.process_time()
            dedup.after_lease()  # the cache and dictionary work, as the service runs it
            late[(b - 1) % len(instances)].finish()  # the previous batch's write, if left
            if b > args.instances:
                totals["after"] += time.perf_counter() - started
                totals["after_cpu"] += time.process_time() - started_cpu
            if b >= args.instances:
                counted += len(batch)
                totals["lease_cpu"] += cpu[-2] - cpu[1]
                for i, name in enumerate(PHASES):
                    totals[name] += wall[i + 1] - wall[i]
                    totals[name + "_cpu"] += cpu[i + 1] - cpu[i]
        redis_cpu = (redis_cpu_s(url) - cpu_start) / counted
    finally:
        for dedup in instances:
            dedup.index.close()
    out: dict[str, Any] = {name: totals[name] / counted * 1e6 for name in totals}
    counts = [d.predecided for d in instances]
    for name in PredecideCounts.__slots__:
        out[name] = sum(getattr(c, name) for c in counts)
    out["lease"] = sum(out[name] for name in HELD)
    out["redis_cpu"] = redis_cpu * 1e6
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=2000, help="documents per batch (2000)")
    p.add_argument("--instances", type=int, default=2, help="index objects taking turns (2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--setups", default="node,cluster")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument(
        "--inside", action="store_true", help="decide inside the lease only, as before 2026-11-26"
    )
    args = p.parse_args()
    results: dict[str, Any] = {"documents": args.documents, "instances": args.instances}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-lease-") as tmp:
        work = Path(tmp)
        for kind in args.setups.split(","):
            start = redis_local.single_node if kind == "node" else redis_local.cluster
            url = stack.enter_context(start(work / kind))
            runs = []
            for r in range(args.repeats):
                raw = documents(args.documents, r)
                docs = [Document(d["id"], d["text"]) for d in raw]
                runs.append(one_run(url, docs, args, r))
            med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
            results[kind] = {"runs": runs, "median": med}
            parts = ", ".join(f"{k} {med[k]:.1f} (CPU {med[k + '_cpu']:.1f})" for k in HELD)
            print(
                f"{kind}: lease {med['lease']:.1f} us/doc ({parts}); after it "
                f"{med['after']:.1f} (CPU {med['after_cpu']:.1f}); before the lease "
                f"{med['before']:.1f}; CPU in the lease: this process "
                f"{med['lease_cpu']:.1f}, Redis {med['redis_cpu']:.1f} us/doc; "
                f"ceiling per index (projection) {1e6 / med['lease']:,.0f} docs/s"
            )
            for i, run in enumerate(runs):
                print(
                    f"  run {i}: lease {run['lease']:.1f} us/doc, deciding {run['decide']:.1f}"
                    f" (CPU {run['decide_cpu']:.1f}); batches decided before the lease"
                    f" {run['batches']}: kept {run['kept']}, docnums moved {run['moved']},"
                    f" in part {run['partly']}, whole {run['redecided']} (documents decided"
                    f" again {run['redecided_docs']}, touched {run['touched_docs']})"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
