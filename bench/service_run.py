"""The service benchmarks' harness: documents, the service as a subprocess, its metrics.

Shared by ``bench_service.py`` (throughput and latency) and the benchmarks that measure a
running service the same way (``bench_check.py``, ``bench_shared.py``, ``bench_lease.py``,
which import these names through ``bench_service``): one way to make the documents, to
write a service's config over fresh topics and to read its ``/metrics``.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from stream_dedup.tools.broker import create_topics, free_port
from stream_dedup.tools.generate import StreamSpec, write_jsonl

__all__ = ["Run", "documents", "produce_all", "quantile", "scrape"]


def documents(n: int, seed: int) -> list[dict[str, Any]]:
    buf = io.StringIO()
    write_jsonl(StreamSpec(documents=n, seed=seed), buf)
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def scrape(port: int) -> dict[str, float]:
    """Samples from /metrics ({} while the port does not answer), by name, labelled ones
    by name and labels as written (``name{label="value"}``)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1) if "{" in line else line.split()[:2]
            out[name] = float(value)
    return out


class Run:
    """Fresh topics, a config file, and the service as a subprocess."""

    def __init__(
        self,
        bootstrap: str,
        workdir: Path,
        args: argparse.Namespace,
        kafka: Mapping[str, str],
        containment: float = 0.0,
    ) -> None:
        self.topic = f"bench-{uuid.uuid4().hex[:8]}"
        self.bootstrap = bootstrap
        self.port = free_port()
        create_topics(bootstrap, [self.topic], partitions=args.partitions)
        create_topics(bootstrap, [f"{self.topic}.unique", f"{self.topic}.duplicates"])
        create_topics(bootstrap, [f"{self.topic}.dlq"])
        self.config = workdir / f"{self.topic}.toml"
        self.config.write_text(
            f"""
[input]
topics = ["{self.topic}"]
[index]
path = "{workdir / self.topic}"
[http]
host = "127.0.0.1"
port = {self.port}
[batch]
max_messages = {args.max_messages}
max_wait_ms = {args.max_wait_ms}
[service]
delivery = "{args.delivery}"
[dedup]
{f"containment = {containment}" if containment else ""}
[log]
level = "WARNING"
[kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "g-{self.topic}"
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "1000"
"""
            + "".join(f'"{k}" = "{v}"\n' for k, v in kafka.items()),
            encoding="utf-8",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dedup.cli", "run", "--config", str(self.config)],
            stdout=subprocess.DEVNULL,
        )

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("service did not become ready")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def produce_all(
    bootstrap: str,
    topic: str,
    docs: list[dict[str, Any]],
    keyed: bool = False,
    rate: float = 0.0,
) -> None:
    """Produce ``docs`` in order; ``keyed``: each keyed by its id (as ``stream-dedup
    produce`` does, so records interleave finely over partitions), else unkeyed (the
    client's sticky partitioner: runs of records per partition); ``rate``: paced at that
    many documents per second (a live stream), else as fast as the client goes."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    start = time.monotonic()
    for n, d in enumerate(docs):
        if rate > 0 and (ahead := start + n / rate - time.monotonic()) > 0:
            time.sleep(ahead)
        key = str(d["id"]).encode() if keyed else None
        while True:
            try:
                producer.produce(topic, json.dumps(d).encode(), key=key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
