"""Service speed through a real broker: sustained throughput and end-to-end latency.

Everything runs on this machine: the broker (an embedded Tansu, or the one at
``KAFKA_BOOTSTRAP_SERVERS``), the service (``stream-dedup run`` as a subprocess, RocksDB
index on disk) and this script's producer and consumer.

1. **throughput**: ``-n`` news-like documents (~1.3 KB, from :mod:`stream_dedup.tools.generate`)
   are produced to the input topic first; then the service starts. Sustained docs/s is
   measured from the first message consumed (``stream_dedup_messages_consumed_total`` > 0,
   polled every 10 ms on ``/metrics``) to the last batch committed (the service's
   ``stream_dedup_last_commit_timestamp_seconds`` once ``stream_dedup_index_documents``
   == n; a batch commits only after all its events are confirmed delivered). Each run
   also prints the CPU per document, from ``/proc``, of the service's loop (its main
   thread), its other threads (RocksDB's, librdkafka's), its sketch worker, the embedded
   broker and this script (:mod:`proc_cpu`): these move far less between runs than the
   rate does, so they tell a change of cost from the host's noise.
2. **latency**: with the service running, documents are produced at a fixed offered load
   (``--rate`` docs/s for ``--seconds``); each carries its send time, and this script's
   consumer of the event topics records send -> event received. p50/p99 reported, and
   the p99 of each third of the run (by send time) beside the CPU the embedded broker
   used in that third: Tansu's memory storage lists every stored batch of a partition on
   each fetch, so its cost, and with it the latency, grows as the run's topics grow.

Each phase is repeated ``--repeats`` times on fresh topics and a fresh index; medians are
reported. ``--delivery exactly-once`` measures the transactional mode (the latency
consumer reads ``read_committed``, so an event counts once its transaction commits).
Targets: at-least-once >= 10,000 docs/s sustained and p99 <= 100 ms at 1,000 docs/s;
exactly-once >= 7,000 docs/s.

    .venv/bin/python bench/bench_service.py
    .venv/bin/python bench/bench_service.py -n 50000 --rate 1000 --seconds 20 --repeats 3
    .venv/bin/python bench/bench_service.py -n 50000 --delivery exactly-once
    .venv/bin/python bench/bench_service.py -n 20000 --containment 0,0.8 --skip-latency
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from proc_cpu import CpuSample, per_document_us, process_cpu_s, render
from service_compare import compare
from service_run import Run, documents, produce_all, quantile, scrape

from stream_dedup.tools.broker import TANSU_CONSUMER_SETTINGS, EmbeddedBroker, free_port

# The harness, and the broker's free_port, as the other service benchmarks import them.
__all__ = ["Run", "documents", "free_port", "main", "produce_all", "quantile", "scrape"]


#: Sustained docs/s each delivery mode is to reach on the 2-CPU reference machine.
TARGETS = {"at-least-once": 10_000, "exactly-once": 7_000}


def throughput(
    bootstrap: str,
    workdir: Path,
    args: argparse.Namespace,
    seed: int,
    kafka: Mapping[str, str],
    broker_pid: int | None,
    containment: float = 0.0,
) -> tuple[float, dict[str, float | None]]:
    """Sustained docs/s of one run (``dedup.containment`` as given), and the CPU per
    document of each part meanwhile.

    The CPU is sampled when the first message is seen consumed and when the last batch
    is seen committed (up to a second later: the idle parts use next to nothing then, the
    broker's idle fetches ~1-2 us per document of a 50,000-document run).
    """
    docs = documents(args.documents, seed)
    run = Run(bootstrap, workdir, args, kafka, containment)
    produce_all(bootstrap, run.topic, docs)
    run.start()
    assert run.proc is not None
    first: float | None = None
    cpu_first: CpuSample | None = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if run.proc.poll() is not None:
                raise RuntimeError(f"the service exited with code {run.proc.returncode}")
            m = scrape(run.port)
            if first is None and m.get("stream_dedup_messages_consumed_total", 0) > 0:
                first = time.time()
                cpu_first = CpuSample.take(run.proc.pid, broker_pid)
            if m.get("stream_dedup_index_documents", 0) >= len(docs):
                assert first is not None and cpu_first is not None
                cpu = per_document_us(
                    cpu_first, CpuSample.take(run.proc.pid, broker_pid), len(docs)
                )
                rate = len(docs) / (m["stream_dedup_last_commit_timestamp_seconds"] - first)
                return rate, cpu
            # A scrape costs the service CPU: poll finely only until the first message is
            # consumed (the service is idle then); the end is the last checkpoint's own
            # timestamp, so polling once a second afterwards (Prometheus scrapes every 15 s
            # by default) does not blur it.
            time.sleep(0.01 if first is None else 1.0)
        raise RuntimeError("throughput run did not finish")
    finally:
        run.stop()


@dataclass
class LatencyRun:
    """One latency run: (send time, seconds to its event) per timed document, and the
    broker's CPU seconds at the start of the timed load and after each third of it."""

    samples: list[tuple[float, float]]
    broker_cpu_s: list[float | None]
    seconds: float

    def thirds(self) -> list[list[float]]:
        """The latencies of documents sent in each third of the timed load."""
        start = min(t for t, _ in self.samples)
        parts: list[list[float]] = [[], [], []]
        for sent, lat in self.samples:
            parts[min(2, int(3 * (sent - start) / self.seconds))].append(lat)
        return parts

    def broker_share(self) -> list[float] | None:
        """The broker's CPU in each third, as a fraction of one core."""
        cpu = [c for c in self.broker_cpu_s if c is not None]
        if len(cpu) != 4:
            return None
        third = self.seconds / 3
        return [(b - a) / third for a, b in itertools.pairwise(cpu)]


def read_events(
    bootstrap: str,
    topic: str,
    kafka: Mapping[str, str],
    total: int,
    state: tuple[list[tuple[float, float]], threading.Event, threading.Event],
) -> None:
    """The latency run's reader of the event topics: (send time, latency) of each timed
    document into ``received``, ``warmed`` set by the first probe's event; until ``total``
    arrived or ``done`` is set."""
    received, warmed, done = state
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"lat-{topic}",
            "enable.auto.commit": False,
            **kafka,
        }
    )
    consumer.assign(
        [
            TopicPartition(f"{topic}.unique", 0, OFFSET_BEGINNING),
            TopicPartition(f"{topic}.duplicates", 0, OFFSET_BEGINNING),
        ]
    )
    while len(received) < total and not done.is_set():
        # poll() returns on the first message; consume(n, timeout) alone would wait
        # until n messages or the timeout, adding up to the timeout to the latency.
        first = consumer.poll(0.1)
        if first is None:
            continue
        for msg in [first, *consumer.consume(1000, 0)]:
            if msg.error() is None:
                now = time.time()
                doc = json.loads(msg.value() or b"{}")["document"]
                if "sent" in doc:
                    received.append((doc["sent"], now - doc["sent"]))
                else:
                    warmed.set()
    consumer.close()


def latency(
    bootstrap: str,
    workdir: Path,
    args: argparse.Namespace,
    seed: int,
    kafka: Mapping[str, str],
    broker_pid: int | None,
) -> LatencyRun:
    """send -> event received for every timed document, and the broker's CPU meanwhile.

    Before the timed load, probe documents go through until one's event comes back, so
    the figures are the steady state at the offered load, not the start-up of the
    service's consumer and of this reader (group join, first fetch).
    """
    total = int(args.rate * args.seconds)
    docs = documents(total, seed)
    run = Run(bootstrap, workdir, args, kafka)
    run.start()
    run.wait_ready()
    received: list[tuple[float, float]] = []
    warmed = threading.Event()
    done = threading.Event()

    reader = threading.Thread(
        target=read_events,
        args=(bootstrap, run.topic, kafka, total, (received, warmed, done)),
        daemon=True,
    )
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all"})
    for probe in range(60):
        text = f"warm-up probe {probe} {uuid.uuid4().hex}"
        doc = {"id": f"probe-{probe}", "title": "probe", "text": text}
        producer.produce(run.topic, json.dumps(doc).encode())
        producer.flush(5)
        if warmed.wait(0.5):
            break
    else:
        raise RuntimeError("no probe event came back within 30 s")
    tick = 0.01
    per_tick = max(1, round(args.rate * tick))
    cuts = [total // 3, 2 * total // 3]
    cpu = [process_cpu_s(broker_pid)]
    start = time.monotonic()
    for i in range(0, total, per_tick):
        target = start + (i / per_tick) * tick
        pause = target - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if cuts and i >= cuts[0]:
            cuts.pop(0)
            cpu.append(process_cpu_s(broker_pid))
        for d in docs[i : i + per_tick]:
            d["sent"] = time.time()
            producer.produce(run.topic, json.dumps(d).encode())
        producer.poll(0)
    cpu.append(process_cpu_s(broker_pid))
    seconds = time.monotonic() - start
    producer.flush(60)
    reader.join(timeout=60)
    done.set()
    run.stop()
    if len(received) < total:
        raise RuntimeError(f"only {len(received)} of {total} events arrived")
    return LatencyRun(received, cpu, seconds)


def throughput_phase(
    bootstrap: str,
    work: Path,
    args: argparse.Namespace,
    kafka: Mapping[str, str],
    pid: int | None,
    results: dict[str, Any],
) -> None:
    """``--repeats`` throughput runs (each ``--containment`` setting alternately), printed
    and added to ``results``."""
    settings = [float(c) for c in args.containment.split(",")]
    rates, cpus, by_setting = [], [], {c: [] for c in settings}
    for r in range(args.repeats):
        for c in settings if r % 2 == 0 else settings[::-1]:
            rate, cpu = throughput(bootstrap, work, args, r, kafka, pid, c)
            rates.append(rate)
            cpus.append(cpu)
            by_setting[c].append((rate, cpu))
            print(f"  throughput run {r + 1} (containment {c}): {rate:,.0f} docs/s; {render(cpu)}")
    results["throughput_docs_per_s"] = rates
    results["throughput_cpu_us_per_document"] = cpus
    print(
        f"throughput: median {statistics.median(rates):,.0f} docs/s over "
        f"{args.documents:,} documents (runs: "
        + ", ".join(f"{r:,.0f}" for r in rates)
        + f")  {args.delivery} target >= {TARGETS[args.delivery]:,}"
    )
    if len(settings) == 2:
        compare(settings, by_setting)


def latency_phase(
    bootstrap: str,
    work: Path,
    args: argparse.Namespace,
    kafka: Mapping[str, str],
    pid: int | None,
    results: dict[str, Any],
) -> None:
    """``--repeats`` latency runs at ``--rate``, printed and added to ``results``."""
    p50s, p99s, thirds, shares = [], [], [], []
    for r in range(args.repeats):
        run = latency(bootstrap, work, args, 100 + r, kafka, pid)
        lat = [x for _, x in run.samples]
        p50s.append(quantile(lat, 0.50) * 1000)
        p99s.append(quantile(lat, 0.99) * 1000)
        thirds.append([quantile(part, 0.99) * 1000 for part in run.thirds()])
        share = run.broker_share()
        shares.append(share)
        print(
            f"  latency run {r + 1}: p50 {p50s[-1]:.1f} ms, p99 {p99s[-1]:.1f} ms; "
            "p99 by third of the run "
            + " / ".join(f"{v:.1f}" for v in thirds[-1])
            + " ms"
            + (
                "; broker CPU by third "
                + " / ".join(f"{100 * v:.0f}%" for v in share)
                + " of a core"
                if share is not None
                else ""
            )
        )
    results["latency_ms"] = {
        "p50": p50s,
        "p99": p99s,
        "p99_by_third": thirds,
        "rate": args.rate,
    }
    results["broker_cpu_share_by_third"] = shares
    print(
        f"latency at {args.rate:,.0f} docs/s offered: median p50 "
        f"{statistics.median(p50s):.1f} ms, median p99 "
        f"{statistics.median(p99s):.1f} ms (runs p99: "
        + ", ".join(f"{v:.1f}" for v in p99s)
        + ")  target p99 <= 100 ms"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=50_000)
    p.add_argument("--rate", type=float, default=1000.0, help="offered load, docs/s (1000)")
    p.add_argument("--seconds", type=float, default=20.0, help="latency phase length (20)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-messages", type=int, default=2000, help="batch.max_messages")
    p.add_argument("--max-wait-ms", type=int, default=20, help="batch.max_wait_ms")
    p.add_argument("--partitions", type=int, default=1, help="input topic partitions (1)")
    p.add_argument(
        "--delivery",
        choices=("at-least-once", "exactly-once"),
        default="at-least-once",
        help="service.delivery (at-least-once)",
    )
    p.add_argument(
        "--containment",
        default="0",
        help="dedup.containment of the throughput runs; two values (0,0.8) are run "
        "alternately in each repeat, the order flipped each time, and compared (0)",
    )
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args()

    broker: EmbeddedBroker | None = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = EmbeddedBroker()
        broker.start()
        bootstrap = broker.bootstrap
    # Client settings the embedded broker needs (see stream_dedup.tools.broker), for the
    # service's clients and this script's; another broker runs with the service's defaults.
    kafka = dict(TANSU_CONSUMER_SETTINGS) if broker is not None else {}
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "documents": args.documents,
        "batch": {"max_messages": args.max_messages, "max_wait_ms": args.max_wait_ms},
        "kafka": kafka,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
            work = Path(tmp)
            pid = broker.pid if broker is not None else None
            if not args.skip_throughput:
                throughput_phase(bootstrap, work, args, kafka, pid, results)
            if not args.skip_latency:
                latency_phase(bootstrap, work, args, kafka, pid, results)
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
