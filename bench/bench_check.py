"""``POST /check`` latency while the service ingests: p50/p99 at a fixed request rate.

Everything runs on this machine: the broker (an embedded Tansu, or the one at
``KAFKA_BOOTSTRAP_SERVERS``), the service (``stream-dedup run`` as a subprocess, RocksDB
index on disk, :class:`bench_service.Run`), this script's producer and its HTTP clients.

1. **preload**: ``--preload`` news-like documents (:mod:`stream_dedup.tools.generate`) are
   produced and the service decides them, so checks run against an index with content.
2. **idle**: checks at ``--rate`` requests/s for ``--seconds``, nothing ingested.
3. **ingesting**: the same checks while a producer offers ``--ingest-rate`` docs/s.

Checks are sent open-loop: request ``i`` is due at ``start + i / rate`` and its latency
is measured from that moment to its answer, so a stalled server is charged for every
request that waited behind it (no coordinated omission). Each request is one document,
from a stream of the same kind (re-runs of stories the index holds, and new stories), on
one of 16 kept-alive connections, with ``?k=5``. The ingest rate reached is
the index's documents added over the phase. Beside the latency seen by the client, the
service's own ``stream_dedup_check_duration_seconds`` (body read to answer) gives the
bucket bounds of its p50/p99: the difference is time spent before the request's handler
ran (the accept queue, the handler thread's start, waits for the interpreter lock).
The answering process's own costs per check over each phase: its CPU
(``process_cpu_seconds_total``), its threads' time on a CPU and on a run queue waiting
for one (the kernel's ``/proc/PID/task/*/schedstat``: how much of the tail is a CPU
shortage), and the check process's follows of the index (count, share of the phase, p99
bucket bound: checks wait for a catch-up). Each phase prints a line when its checks start,
for a profiler attached meanwhile (``py-spy record -p PID``).
Phases 2 and 3 alternate ``--repeats`` times on the one service; medians are reported.
Target: p99 <= 20 ms at 200 requests/s while the service ingests 5,000 docs/s.

``--checks process`` (the default) sends the checks to the check process's port
(``http.check_port``), whose ``/metrics`` has the server-side histogram; ``--checks
inline`` sets ``http.check_process = false`` and sends them to the service's port. To
compare the two, alternate runs of each (``--repeats 1``, several rounds) and compare
medians: the machine's load drifts between runs.

    .venv/bin/python bench/bench_check.py
    .venv/bin/python bench/bench_check.py --rate 200 --ingest-rate 5000 --seconds 15
    .venv/bin/python bench/bench_check.py --preload 5000 --ingest-rate 1000 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_procs import SchedSampler, answering_pid, reader_pids
from bench_service import Run, documents, free_port, produce_all, quantile, scrape
from confluent_kafka import Producer
from cpu_time import cpu_s

from stream_dedup.tools.broker import TANSU_CONSUMER_SETTINGS, EmbeddedBroker


def wait_indexed(run: Run, n: float, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scrape(run.port).get("stream_dedup_index_documents", 0) >= n:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the index did not reach {n} documents")


def server_buckets(port: int, name: str = "check_duration") -> dict[float, float]:
    """A histogram of the answering process (its check latency, or ``check_follow``: its
    follows of the index): cumulative count per upper bound."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(f"stream_dedup_{name}_seconds_bucket{{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(bound)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` of the requests in between."""
    counts = sorted((b, after[b] - before.get(b, 0.0)) for b in after)
    total = counts[-1][1] if counts else 0.0
    if not total:
        return 0.0
    for bound, count in counts:
        if count >= q * total:
            return bound
    return float("inf")


_local = threading.local()


def check_once(port: int, body: bytes) -> int:
    """One check on this thread's connection (kept alive, as a client sending many
    checks would: the port speaks HTTP/1.1)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/check?k=5", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        conn.close()
        _local.conn = None
        raise


def checks(port: int, bodies: list[bytes], rate: float, seconds: float) -> list[float]:
    """Open-loop checks at ``rate``/s for ``seconds``: each one's latency from its due
    time (seconds). A non-200 answer is an error."""
    total = int(rate * seconds)
    latencies: list[float] = [0.0] * total
    failures: list[int] = []

    def one(i: int, due: float) -> None:
        status = check_once(port, bodies[i % len(bodies)])
        latencies[i] = time.monotonic() - due
        if status != 200:
            failures.append(status)

    with ThreadPoolExecutor(max_workers=16) as pool:
        start = time.monotonic()
        for i in range(total):
            due = start + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            pool.submit(one, i, due)
    if failures:
        raise RuntimeError(f"{len(failures)} checks failed: {sorted(set(failures))}")
    return latencies


def ingest(
    run: Run, docs: list[bytes], rate: float, stop: threading.Event, sent: list[int]
) -> None:
    """Offer ``docs`` (encoded beforehand: this thread shares the interpreter with the
    check clients, whose latencies it would otherwise lengthen) at ``rate``/s in 10 ms
    ticks until all are sent or ``stop``; the number sent is appended to ``sent``."""
    producer = Producer({"bootstrap.servers": run.bootstrap, "linger.ms": 5, "acks": "all"})
    per_tick = max(1, round(rate * 0.01))
    start = time.monotonic()
    count = 0
    for n, i in enumerate(range(0, len(docs), per_tick)):
        if stop.is_set():
            break
        pause = start + n * 0.01 - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        for d in docs[i : i + per_tick]:
            while True:
                try:
                    producer.produce(run.topic, d)
                    break
                except BufferError:
                    producer.poll(0.01)
            count += 1
        producer.poll(0)
    producer.flush(60)
    sent.append(count)


def phase(
    run: Run, bodies: list[bytes], args: argparse.Namespace, feed: list[bytes] | None
) -> dict[str, float]:
    """One phase of checks, with ``feed`` offered meanwhile (``None``: idle); its
    latencies, the ingest rate reached, and the documents offered (``sent``)."""
    port = args.check_port
    before = scrape(run.port).get("stream_dedup_index_documents", 0)
    served = server_buckets(port)
    before_scrape = scrape(port)
    cpu_before = before_scrape.get("process_cpu_seconds_total", 0.0)
    follows = server_buckets(port, "check_follow")
    stop = threading.Event()
    producer = None
    sent: list[int] = []
    if feed is not None:
        producer = threading.Thread(target=ingest, args=(run, feed, args.ingest_rate, stop, sent))
        producer.start()
        time.sleep(1.0)  # the service is deciding the offered load before checks start
    # for a profiler attached to the check process (py-spy): when each phase runs
    print(f"  phase {'idle' if feed is None else 'ingesting'}: checks start", flush=True)
    readers = reader_pids(args.answering_pid)
    readers_cpu = cpu_s(readers)
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        sched = stack.enter_context(SchedSampler(args.answering_pid))
        in_readers = [stack.enter_context(SchedSampler(pid)) for pid in readers]
        lat = checks(port, bodies, args.rate, args.seconds)
    spent = time.monotonic() - began
    readers_cpu = cpu_s(readers) - readers_cpu
    readers_ran = sum(s.totals()[0] for s in in_readers)
    readers_waited = sum(s.totals()[1] for s in in_readers)
    after = scrape(run.port).get("stream_dedup_index_documents", 0)
    served_after = server_buckets(port)
    after_scrape = scrape(port)
    cpu_after = after_scrape.get("process_cpu_seconds_total", 0.0)
    follows_after = server_buckets(port, "check_follow")
    ran, waited = sched.totals()
    follow_s = after_scrape.get("stream_dedup_check_follow_seconds_sum", 0.0)
    follow_s -= before_scrape.get("stream_dedup_check_follow_seconds_sum", 0.0)
    load = os.getloadavg()[0]
    stop.set()
    if producer is not None:
        producer.join()
    return {
        "p50_ms": quantile(lat, 0.50) * 1000,
        "p95_ms": quantile(lat, 0.95) * 1000,
        "p99_ms": quantile(lat, 0.99) * 1000,
        "max_ms": max(lat) * 1000,
        "ingested_docs_per_s": (after - before) / spent,
        "sent": float(sum(sent)),
        "server_p50_le_ms": bucket_quantile(served, served_after, 0.50) * 1000,
        "server_p99_le_ms": bucket_quantile(served, served_after, 0.99) * 1000,
        # the answering process's CPU over the phase (its catch-ups included) per check
        "cpu_per_check_ms": (cpu_after - cpu_before) / len(lat) * 1000,
        # its follows of the index (the checks wait for a RocksDB catch-up): how many,
        # the share of the phase spent in them, and the bucket bound of their p99
        "follows": follows_after.get(float("inf"), 0.0) - follows.get(float("inf"), 0.0),
        "follow_share": follow_s / spent,
        "follow_p99_le_ms": bucket_quantile(follows, follows_after, 0.99) * 1000,
        # its threads' time on a CPU and waiting for one (run queue), per check
        "on_cpu_per_check_ms": ran / len(lat) / 1e6,
        "cpu_wait_per_check_ms": waited / len(lat) / 1e6,
        # the check process's readers (RocksDB: two processes answering the reads and
        # catching up in turn): their CPU, and their time on a CPU and on a run queue
        "readers": float(len(readers)),
        "readers_cpu_per_check_ms": readers_cpu / len(lat) * 1000,
        "readers_on_cpu_per_check_ms": readers_ran / len(lat) / 1e6,
        "readers_cpu_wait_per_check_ms": readers_waited / len(lat) / 1e6,
        "load_1m": load,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preload", type=int, default=20_000, help="documents indexed first")
    p.add_argument("--rate", type=float, default=200.0, help="checks per second (200)")
    p.add_argument("--ingest-rate", type=float, default=5000.0, help="docs/s offered (5000)")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each phase (15)")
    p.add_argument("--repeats", type=int, default=3, help="idle/ingesting pairs (3)")
    p.add_argument("--max-messages", type=int, default=2000, help="batch.max_messages")
    p.add_argument("--max-wait-ms", type=int, default=20, help="batch.max_wait_ms")
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        help="the service's service.switch_interval_ms (default: its own setting)",
    )
    p.add_argument(
        "--checks",
        choices=("process", "readers", "inline"),
        default="process",
        help="answered by the check process (default), by it with two RocksDB readers "
        "(http.check_readers), or in the service's process",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args()
    args.partitions, args.delivery = 1, "at-least-once"  # as bench_service.Run reads them

    broker: EmbeddedBroker | None = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = EmbeddedBroker()
        broker.start()
        bootstrap = broker.bootstrap
    kafka = dict(TANSU_CONSUMER_SETTINGS) if broker is not None else {}
    per_phase = int(args.ingest_rate * (args.seconds + 3))
    stream = documents(args.preload + args.repeats * per_phase, seed=5)
    preload, rest = stream[: args.preload], stream[args.preload :]
    asked = documents(2000, seed=6)  # re-runs of the same kind of stories, and new ones
    bodies = [json.dumps({**d, "id": f"check-{i}"}).encode() for i, d in enumerate(asked)]
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "args": {
            k: v for k, v in vars(args).items() if k not in ("json", "check_port", "answering_pid")
        },
        "idle": [],
        "ingesting": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
            run = Run(bootstrap, Path(tmp), args, kafka)
            text = run.config.read_text(encoding="utf-8")
            in_process = args.checks != "inline"
            args.check_port = free_port() if in_process else run.port
            http = f"check_process = {str(in_process).lower()}\n"
            http += f"check_readers = {str(args.checks == 'readers').lower()}\n"
            http += f"check_port = {args.check_port}\n"
            text = text.replace("[http]\n", "[http]\n" + http, 1)
            if args.switch_interval_ms is not None:
                line = f"switch_interval_ms = {args.switch_interval_ms}\n"
                text = text.replace("[service]\n", "[service]\n" + line, 1)
            run.config.write_text(text)
            run.start()
            try:
                run.wait_ready(timeout_s=600)  # a first start compiles the kernels
                offered = float(len(preload))
                produce_all(bootstrap, run.topic, preload)
                wait_indexed(run, len(preload))
                checks(args.check_port, bodies, 50, 2)  # warm the path (connections, caches)
                args.answering_pid = answering_pid(run, args.checks)
                for r in range(args.repeats):
                    idle = phase(run, bodies, args, None)
                    feed = [
                        json.dumps(d).encode() for d in rest[r * per_phase : (r + 1) * per_phase]
                    ]
                    busy = phase(run, bodies, args, feed)
                    results["idle"].append(idle)
                    results["ingesting"].append(busy)
                    print(
                        f"  round {r + 1}: idle p50 {idle['p50_ms']:.1f} ms p99 "
                        f"{idle['p99_ms']:.1f} ms | ingesting p50 {busy['p50_ms']:.1f} ms "
                        f"p95 {busy['p95_ms']:.1f} ms p99 {busy['p99_ms']:.1f} ms max "
                        f"{busy['max_ms']:.0f} ms, "
                        f"{busy['ingested_docs_per_s']:,.0f} docs/s ingested; in the "
                        f"service (histogram bucket bounds): idle p99 <= "
                        f"{idle['server_p99_le_ms']:g} ms, ingesting p50 <= "
                        f"{busy['server_p50_le_ms']:g} ms, p99 <= {busy['server_p99_le_ms']:g} ms"
                        f"; CPU per check idle {idle['cpu_per_check_ms']:.2f} ms, ingesting "
                        f"{busy['cpu_per_check_ms']:.2f} ms; ingesting, {busy['follows']:.0f} "
                        f"follows, {busy['follow_share']:.1%} of the time, p99 <= "
                        f"{busy['follow_p99_le_ms']:g} ms; per check on a CPU / waiting for one: "
                        f"idle {idle['on_cpu_per_check_ms']:.2f} / "
                        f"{idle['cpu_wait_per_check_ms']:.2f} ms, ingesting "
                        f"{busy['on_cpu_per_check_ms']:.2f} / {busy['cpu_wait_per_check_ms']:.2f}"
                        f" ms; readers' CPU per check idle {idle['readers_cpu_per_check_ms']:.2f}"
                        f" ms, ingesting {busy['readers_cpu_per_check_ms']:.2f} ms (on a CPU /"
                        f" waiting {busy['readers_on_cpu_per_check_ms']:.2f} / "
                        f"{busy['readers_cpu_wait_per_check_ms']:.2f} ms)"
                        f"; load {busy['load_1m']:.1f}"
                    )
                    offered += busy["sent"]
                    wait_indexed(run, offered)
            finally:
                run.stop()
    finally:
        if broker is not None:
            broker.stop()

    def med(kind: str, key: str) -> float:
        return statistics.median(x[key] for x in results[kind])

    print(
        f"/check ({args.checks}) at {args.rate:.0f} req/s: idle median p50 "
        f"{med('idle', 'p50_ms'):.1f} ms, p99 {med('idle', 'p99_ms'):.1f} ms; while ingesting "
        f"(offered {args.ingest_rate:,.0f} docs/s, reached "
        f"{med('ingesting', 'ingested_docs_per_s'):,.0f}) median p50 "
        f"{med('ingesting', 'p50_ms'):.1f} ms, p95 {med('ingesting', 'p95_ms'):.1f}"
        f" ms, p99 {med('ingesting', 'p99_ms'):.1f} ms  target p99 <= 20 ms"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
