"""``make demo``: the whole service on an embedded broker and a bundled sample stream.

Steps: start Tansu (from the ``embedded`` extra) on a free loopback port, create the
topics, produce the synthetic wire-story stream (plus a few malformed messages, to show
the dead-letter topic), run the real service in this process against a fresh RocksDB
index, follow its metrics until every message has an outcome, then print what happened
and stop everything cleanly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stream_dedup.dedup import COMPILING_NOTICE, kernels_cached
from stream_dedup.service.config_loading import load_config
from stream_dedup.tools.broker import (
    TANSU_CONSUMER_SETTINGS,
    BrokerStartError,
    EmbeddedBroker,
    create_topics,
    free_port,
)
from stream_dedup.tools.generate import StreamSpec, generate
from stream_dedup.tools.produce import ProduceError, produce_lines

if TYPE_CHECKING:
    from stream_dedup.service.config import ServiceConfig
    from stream_dedup.service.loop import Service

#: Malformed messages mixed into the sample: each lands in the dead-letter topic.
BAD_MESSAGES: tuple[bytes, ...] = (
    b"{not json",
    b'{"title": "no id here", "text": "a record without an id field"}',
    b'{"id": "doc-bad-1", "headline": "content in the wrong field"}',
    b"\xff\xfe invalid utf-8",
)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    documents: int = 3000
    seed: int = 7
    http_port: int = 9400  # taken: any free port
    index_dir: str | None = None
    keep_running: bool = False
    timeout_s: float = 300.0
    broker_port: int = 0  # 0: any free port
    broker_only: bool = False


#: The demo's topics: the input and the three the service writes.
DEMO_TOPICS = ("news", "news.unique", "news.duplicates", "news.dlq")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _metric(service: Any, name: str, labels: dict[str, str] | None = None) -> float:
    value = service.registry.get_sample_value(name, labels or {})
    return float(value or 0.0)


def _outcomes(service: Any) -> tuple[int, int, int]:
    unique = int(_metric(service, "stream_dedup_verdicts_total", {"verdict": "unique"}))
    dup = int(_metric(service, "stream_dedup_verdicts_total", {"verdict": "duplicate"}))
    dead = sum(
        int(s.value)
        for metric in service.registry.collect()
        if metric.name == "stream_dedup_dead_letters"
        for s in metric.samples
        if s.name == "stream_dedup_dead_letters_total"
    )
    return unique, dup, dead


def _read_topic(bootstrap: str, topic: str, expected: int) -> list[dict[str, Any]]:
    """The first ``expected`` events of a one-partition topic (or all that come in time).

    Counting by the expected number rather than the high watermark: a broker's watermark
    semantics differ (Tansu counts record batches), the event count from metrics does not.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-reader-{time.monotonic_ns()}",
            "enable.auto.commit": "false",
            "session.timeout.ms": "6000",
            **TANSU_CONSUMER_SETTINGS,
        },
        logger=logging.getLogger("stream_dedup.tools.produce"),
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(events) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            events.append(json.loads(msg.value() or b"{}"))
        return events
    finally:
        consumer.close()


@contextlib.contextmanager
def _broker(opts: DemoOptions, log_path: Path) -> Iterator[EmbeddedBroker]:
    """The embedded broker on ``opts.broker_port`` (any free one for 0), while in use."""
    if opts.broker_port and not _is_free(opts.broker_port):
        raise BrokerStartError(
            f"port {opts.broker_port} is taken: choose another --broker-port (or 0 for any)"
        )
    with EmbeddedBroker(port=opts.broker_port or None, log_path=log_path) as broker:
        yield broker


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_broker(opts: DemoOptions, out: IO[str]) -> int:
    """``demo --broker-only``: the embedded broker with the demo's topics, up until Ctrl-C,
    for trying ``run`` and ``produce`` by hand."""
    with (
        tempfile.TemporaryDirectory(prefix="stream-dedup-broker-") as tmp,
        _broker(opts, Path(tmp) / "broker.log") as broker,
    ):
        create_topics(broker.bootstrap, list(DEMO_TOPICS))
        b = broker.bootstrap
        print(
            f"embedded broker (Tansu, in memory) at {b} with topics {', '.join(DEMO_TOPICS)}"
            "; up until Ctrl-C. From other terminals:\n"
            f"  stream-dedup run --bootstrap-servers {b} --set kafka.session.timeout.ms=6000\n"
            f"  stream-dedup generate -n 3000 | stream-dedup produce - --topic news "
            f"--bootstrap-servers {b}",
            file=out,
            flush=True,
        )
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _interrupt)  # a plain `kill` stops the broker too
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(0.5)
    print("broker stopped", file=out)
    return 0


def run_demo(opts: DemoOptions, out: IO[str]) -> int:
    """Run the demo end to end; returns the exit code."""
    from stream_dedup.service.loop import Service

    if opts.broker_only:
        return run_broker(opts, out)
    # The demo prints its own summary; the service's per-message warnings (the malformed
    # messages are deliberate) and librdkafka's start-up reconnects would only be noise.
    logging.getLogger("stream_dedup").setLevel(logging.ERROR)
    logging.getLogger("stream_dedup.tools.produce").setLevel(logging.CRITICAL)
    records = list(generate(StreamSpec(documents=opts.documents, seed=opts.seed)))
    titles = {r["id"]: r["title"] for r in records}
    port = opts.http_port if opts.http_port and _is_free(opts.http_port) else free_port()
    with tempfile.TemporaryDirectory(prefix="stream-dedup-demo-") as tmp:
        index_dir = opts.index_dir or str(Path(tmp) / "index")
        print("starting the embedded Kafka-protocol broker (Tansu) ...", file=out)
        with _broker(opts, Path(tmp) / "broker.log") as broker:
            total = _produce_sample(broker.bootstrap, records, out)
            service = Service(_demo_config(broker.bootstrap, index_dir, port))
            if not kernels_cached():  # the service logs it, but the demo's log level hides it
                print(COMPILING_NOTICE, file=out)
            thread = threading.Thread(target=service.run, name="stream-dedup", daemon=True)
            thread.start()
            url = f"http://127.0.0.1:{port}/metrics"
            print(f"service running; metrics at {url}", file=out)
            done, wall = _follow(service, total, opts.timeout_s, out)
            busy = _metric(service, "stream_dedup_batch_duration_seconds_sum")
            unique, dup, dead = _outcomes(service)
            clusters = Counter(
                e["cluster_id"] for e in _read_topic(broker.bootstrap, "news.duplicates", dup)
            )
            print(_summary(unique, dup, dead, busy, wall, clusters, titles, url), file=out)
            if done < total:
                print(f"error: only {done} of {total} messages were decided in time", file=out)
            if opts.keep_running and done >= total:
                print("--keep-running: service up until Ctrl-C", file=out)
                try:
                    while thread.is_alive():
                        time.sleep(0.5)
                except KeyboardInterrupt:
                    pass
            service.stop()
            thread.join(timeout=60)
            print(
                "service stopped cleanly" if not thread.is_alive() else "service did not stop",
                file=out,
            )
        return 0 if done >= total else 1


def _produce_sample(bootstrap: str, records: list[dict[str, Any]], out: IO[str]) -> int:
    """Create the demo's topics and produce the stories with the malformed messages mixed
    in; returns how many messages were produced."""
    create_topics(bootstrap, list(DEMO_TOPICS))
    lines = [json.dumps(r).encode() for r in records]
    step = max(1, len(lines) // (len(BAD_MESSAGES) + 1))
    for n, bad in enumerate(BAD_MESSAGES, start=1):
        lines.insert(n * step, bad)
    sent = produce_lines(lines, "news", {"bootstrap.servers": bootstrap}, on_error="fail")
    if sent.stopped_at is not None:  # the sample's lines are small: not expected
        raise ProduceError(f"the demo's sample could not be sent: {sent.stopped_at.render()}")
    print(
        f"produced {len(records):,} wire stories and {len(BAD_MESSAGES)} malformed "
        f"messages to topic 'news' at {bootstrap}",
        file=out,
    )
    return len(lines)


def _demo_config(bootstrap: str, index_dir: str, port: int) -> ServiceConfig:
    """The service's settings for the demo, layered as a user's would be."""
    return load_config(
        None,
        environ={},
        overrides={
            "kafka": {
                "bootstrap.servers": bootstrap,
                "group.id": "stream-dedup-demo",
                "session.timeout.ms": "6000",
                **TANSU_CONSUMER_SETTINGS,
            },
            "input": {"topics": ["news"]},
            "index": {"path": index_dir},
            "http": {"port": port, "host": "127.0.0.1", "check_port": 0},
            "log": {"level": "WARNING"},
        },
    )


def _follow(service: Service, total: int, timeout_s: float, out: IO[str]) -> tuple[int, float]:
    """Show progress until every message is decided or ``timeout_s`` passed; returns how
    many were decided and the seconds from the first decided one to the last."""
    first: float | None = None
    deadline = time.monotonic() + timeout_s
    done = 0
    tty = out.isatty()
    shown = 0.0
    while time.monotonic() < deadline:
        unique, dup, dead = _outcomes(service)
        done = unique + dup + dead
        now = time.monotonic()
        if done and first is None:
            first = now
        if tty or now - shown >= 2.0 or done >= total:
            shown = now
            line = f"{done:,}/{total:,} messages decided ({dup:,} duplicates, {dead} dead-lettered)"
            out.write(f"\r{line}" if tty else f"{line}\n")
            out.flush()
        if done >= total:
            break
        time.sleep(0.2)
    if tty:
        out.write("\n")
    return done, time.monotonic() - (first or time.monotonic())


def _summary(
    unique: int,
    dup: int,
    dead: int,
    busy: float,
    wall: float,
    clusters: Counter[str],
    titles: dict[str, str],
    url: str,
) -> str:
    docs = unique + dup
    rate = docs / busy if busy > 0 else 0.0
    lines = [
        "",
        f"documents      {docs:,}",
        f"unique         {unique:,}",
        f"duplicate      {dup:,} ({100.0 * dup / max(docs, 1):.1f}%)",
        f"dead-lettered  {dead:,}",
        f"throughput     {rate:,.0f} docs/s while processing ({busy:.2f} s in batches; "
        f"{wall:.1f} s from first to last decision)",
        "",
        "largest duplicate clusters (a story and the re-runs caught):",
    ]
    for cluster, count in clusters.most_common(5):
        title = titles.get(cluster, "")
        lines.append(f"  {count:3d} re-runs of {cluster}  {title[:60]}")
    lines.append("")
    lines.append(f"metrics: {url}")
    return "\n".join(lines)
