"""One broker hop: produce -> consume latency at a fixed rate, with settings to compare.

The service's end-to-end latency contains two such hops (document in, event out); this
script measures one alone, with plain confluent-kafka clients and no service, so that a
client or broker setting can be judged by itself. The broker is an embedded Tansu, or
the one at ``KAFKA_BOOTSTRAP_SERVERS``.

Each repeat creates a fresh one-partition topic, assigns a consumer to it (in a thread of
this process), waits until a probe message has made the round trip (so connection set-up
and the first fetch are not measured), then produces ``--size``-byte messages at
``--rate`` per second for ``--seconds``. Every message carries its send time; reported
are the quantiles of

* **acked**: ``produce()`` -> delivery report (the producer's half: batching, acks);
* **hop**: ``produce()`` -> message returned by the consumer's ``consume()``.

Medians over repeats of each quantile are printed. librdkafka settings for either client
are given as ``--producer-set key=value`` / ``--consumer-set key=value`` (repeatable),
on top of librdkafka's defaults plus ``bootstrap.servers`` and ``group.id``::

    .venv/bin/python bench/bench_hop.py
    .venv/bin/python bench/bench_hop.py --consumer-set fetch.wait.max.ms=5
    .venv/bin/python bench/bench_hop.py --producer-set linger.ms=0 --rate 1000 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from stream_dedup.tools.broker import EmbeddedBroker, create_topics

#: Message header: a marker (probe or measured) and the perf_counter_ns() at produce().
_HEAD = struct.Struct("<?q")
QUANTILES = (0.50, 0.90, 0.99, 1.0)


def settings(pairs: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a pair without '=' is a usage error."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Reader(threading.Thread):
    """Consumes the topic and records, per measured message, produce -> consume in ms."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(conf)
        self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.latencies: list[float] = []
        self.sent: list[int] = []  # perf_counter_ns() at produce, parallel to latencies
        self.probed = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            # poll() returns as soon as one message is there; consume(n, timeout) would
            # wait until it has n messages or the timeout passed, adding up to that timeout.
            first = self.consumer.poll(0.05)
            if first is None:
                continue
            for msg in [first, *self.consumer.consume(1000, 0)]:
                now = time.perf_counter_ns()
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        print(f"consume error: {err}", file=sys.stderr)
                    continue
                measured, sent = _HEAD.unpack_from(msg.value() or b"")
                if measured:
                    self.latencies.append((now - sent) / 1e6)
                    self.sent.append(sent)
                else:
                    self.probed.set()
        self.consumer.close()


def one_run(bootstrap: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """One fresh topic, one timed run: acked and hop latencies in ms, hop send times in s."""
    topic = f"hop-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic])
    consumer_conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{topic}",
        "enable.auto.commit": False,
        **settings(args.consumer_set),
    }
    producer_conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        **settings(args.producer_set),
    }
    reader = Reader(consumer_conf, topic)
    reader.start()
    producer = Producer(producer_conf)
    acked: list[float] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            print(f"delivery failed: {err}", file=sys.stderr)
            return
        measured, sent = _HEAD.unpack_from(msg.value() or b"")
        if measured:
            acked.append((now - sent) / 1e6)

    pad = b"x" * max(0, args.size - _HEAD.size)
    deadline = time.monotonic() + 30
    while not reader.probed.is_set():  # connections up and the consumer fetching
        producer.produce(topic, _HEAD.pack(False, time.perf_counter_ns()))
        producer.flush(5)
        if reader.probed.wait(0.5) or time.monotonic() > deadline:
            break
    if not reader.probed.is_set():
        raise RuntimeError("the probe message never came back")

    total = int(args.rate * args.seconds)
    start = time.perf_counter()
    start_ns = time.perf_counter_ns()
    for i in range(total):
        due = start + i / args.rate
        while (pause := due - time.perf_counter()) > 0:
            producer.poll(pause)  # serves delivery reports while it waits, not after
        payload = _HEAD.pack(True, time.perf_counter_ns()) + pad
        while True:
            try:
                producer.produce(topic, payload, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(30)
    wait_until = time.monotonic() + 30
    while len(reader.latencies) < total and time.monotonic() < wait_until:
        time.sleep(0.05)
    reader.stop.set()
    reader.join(10)
    if len(reader.latencies) < total:
        raise RuntimeError(f"only {len(reader.latencies)} of {total} messages came back")
    sent_s = [(t - start_ns) / 1e9 for t in reader.sent]
    return {"acked": acked, "hop": reader.latencies, "sent_s": sent_s}


def timeline(run: dict[str, list[float]], every: float) -> str:
    """Hop p50/p99 per window of send time: shows latency that grows as the topic does."""
    windows: dict[int, list[float]] = {}
    for sent, lat in zip(run["sent_s"], run["hop"], strict=True):
        windows.setdefault(int(sent // every), []).append(lat)
    return "\n".join(
        f"    {w * every:6.0f} s  p50 {quantile(v, 0.5):7.1f}  p99 {quantile(v, 0.99):7.1f} ms"
        for w, v in sorted(windows.items())
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: bench_hop.py --consumer-set fetch.wait.max.ms=5 --repeats 3",
    )
    p.add_argument("--rate", type=float, default=1000.0, help="messages/s offered (1000)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of one run (10)")
    p.add_argument("--size", type=int, default=1000, help="message value bytes (1000)")
    p.add_argument("--repeats", type=int, default=3, help="runs, fresh topic each (3)")
    p.add_argument(
        "--producer-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka producer setting (repeatable)",
    )
    p.add_argument(
        "--consumer-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka consumer setting (repeatable)",
    )
    p.add_argument(
        "--every",
        type=float,
        metavar="SECONDS",
        help="also print each run's hop p50/p99 per window of this many seconds",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)

    broker: EmbeddedBroker | None = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = EmbeddedBroker()
        broker.start()
        bootstrap = broker.bootstrap
    runs: list[dict[str, list[float]]] = []
    try:
        for _ in range(args.repeats):
            runs.append(one_run(bootstrap, args))
    finally:
        if broker is not None:
            broker.stop()

    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "broker": "external" if broker is None else "embedded tansu",
        "rate": args.rate,
        "seconds": args.seconds,
        "size": args.size,
        "producer": settings(args.producer_set),
        "consumer": settings(args.consumer_set),
    }
    print(
        f"{results['broker']}, {args.rate:,.0f} msg/s x {args.seconds:g} s, "
        f"{args.size} B, {args.repeats} runs; producer {results['producer'] or 'defaults'}, "
        f"consumer {results['consumer'] or 'defaults'}"
    )
    for kind in ("acked", "hop"):
        per_q = {q: [quantile(run[kind], q) for run in runs] for q in QUANTILES}
        results[kind] = {f"p{round(q * 100)}": v for q, v in per_q.items()}
        print(
            f"  {kind:>5} ms (median of runs): "
            + "  ".join(
                f"{'max' if q == 1.0 else f'p{round(q * 100)}'} {statistics.median(v):7.1f}"
                for q, v in per_q.items()
            )
            + "   runs p99: "
            + ", ".join(f"{v:.1f}" for v in per_q[0.99])
        )
    if args.every:
        for i, run in enumerate(runs, start=1):
            print(f"  run {i}, hop by send time:\n{timeline(run, args.every)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
