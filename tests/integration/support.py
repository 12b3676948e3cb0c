"""Helpers for the broker tests: documents, configs, producing, reading topics, a service thread."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from stream_dedup.cli.app import main as cli_main
from stream_dedup.index import keys, open_index
from stream_dedup.index.records import decode_doc
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.config_loading import build_config
from stream_dedup.service.loop import DeduplicatorFactory, Service, default_deduplicator
from stream_dedup.tools.broker import create_topics
from tests.corpus import kijiji_contents

Header = tuple[str, bytes]


def kijiji_documents(limit: int | None = None) -> list[dict[str, str]]:
    """The ads (:mod:`tests.corpus`) as documents: id = row number, content = Title + " " +
    Short Description, the first ``limit`` of them (all without one).

    Content goes in ``title`` alone so the default joiner does not change it.
    """
    ads = kijiji_contents()[:limit]
    return [{"id": str(row), "title": content} for row, content in enumerate(ads, start=1)]


@dataclass(frozen=True)
class Topics:
    """A fresh set of topic names for one test, and the group to consume with."""

    input: str
    unique: str
    duplicates: str
    dlq: str
    group: str

    @classmethod
    def fresh(cls) -> Topics:
        base = f"news-{uuid.uuid4().hex[:10]}"
        return cls(base, f"{base}.unique", f"{base}.duplicates", f"{base}.dlq", f"g-{base}")

    def create(self, bootstrap: str, partitions: int = 1) -> None:
        create_topics(bootstrap, [self.input], partitions)
        create_topics(bootstrap, [self.unique, self.duplicates, self.dlq], 1)


def make_config(
    bootstrap: str, topics: Topics, index: Path, **sections: dict[str, Any]
) -> ServiceConfig:
    """A service config for tests: short session timeout (Tansu), free HTTP port."""
    layers: dict[str, dict[str, Any]] = {
        "input": {"topics": [topics.input]},
        "index": {"path": str(index)},
        # Checks in the service's process unless a test asks for the check process.
        "http": {"port": 0, "host": "127.0.0.1", "check_process": False},
        "batch": {"max_messages": 500, "max_wait_ms": 20},
        "service": {"shutdown_timeout_s": 20.0, "backoff_initial_s": 0.1},
        "kafka": {
            "bootstrap.servers": bootstrap,
            "group.id": topics.group,
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "statistics.interval.ms": "500",
        },
    }
    for name, values in sections.items():
        layers.setdefault(name, {}).update(values)
    return build_config([layers])


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None, list[Header] | None]],
    partition: int | None = None,
) -> int:
    """Produce (key, value, headers) records in order and wait for every delivery."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    errors: list[Any] = []
    n = 0
    for key, value, headers in records:
        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(
                    topic, on_delivery=lambda err, _m: errors.append(err) if err else None, **kwargs
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        n += 1
    assert producer.flush(30) == 0
    assert not errors, errors
    return n


def produce_json(bootstrap: str, topic: str, docs: Iterable[dict[str, Any]]) -> int:
    return produce(bootstrap, topic, ((None, json.dumps(d).encode(), None) for d in docs))


def read_topic(
    bootstrap: str,
    topic: str,
    expected: int = 0,
    timeout_s: float = 60.0,
    partitions: int = 1,
    idle_s: float = 1.5,
) -> list[Message]:
    """Every message of ``topic``: at least ``expected``, then until ``idle_s`` brings none.

    (Watermark offsets would be neater, but not every broker for tests reports them.)
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            got = [m for m in consumer.consume(1000, 0.2) if m.error() is None]
            out += got
            now = time.monotonic()
            if got:
                last_new = now
            elif len(out) >= expected and now - last_new >= idle_s:
                break
    finally:
        consumer.close()
    return out


def events(msgs: list[Message]) -> list[dict[str, Any]]:
    return [json.loads(m.value() or b"null") for m in msgs]


class ServiceThread:
    """A :class:`Service` running in a thread of the test process, with its own registry."""

    def __init__(
        self, config: ServiceConfig, deduplicator: DeduplicatorFactory = default_deduplicator
    ) -> None:
        self.registry = CollectorRegistry()
        self.service = Service(config, self.registry, deduplicator)
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.exit_code = self.service.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> ServiceThread:
        self._thread.start()
        return self

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    def wait_for(self, name: str, value: float, timeout_s: float = 60.0) -> None:
        """Until metric ``name`` reaches ``value`` (e.g. documents committed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.metric(name) >= value:
                return
            if self.error is not None:
                raise self.error
            time.sleep(0.05)
        raise AssertionError(f"{name} stayed at {self.metric(name)}, expected {value}")

    def join(self, timeout_s: float) -> None:
        """Wait for the service to stop by itself (an error, say)."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the service did not stop by itself"

    def stop(self, timeout_s: float = 30.0) -> int:
        self.service.stop()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "service did not stop in time"
        if self.error is not None:
            raise self.error
        assert self.exit_code is not None
        return self.exit_code


def http_get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET on the service's HTTP port (errors are answers too)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int, name: str) -> float | None:
    """One unlabelled sample from /metrics, or None when the port does not answer yet."""
    try:
        status, body = http_get(port, "/metrics")
    except OSError:
        return None
    if status != 200:
        return None
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def write_toml(path: Path, config: dict[str, dict[str, Any]]) -> Path:
    """A minimal TOML writer for test configs (strings, numbers, bools, string lists,
    nested tables)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return str(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))

    lines: list[str] = []

    def table(title: str, values: dict[str, Any]) -> None:
        lines.append(f"[{title}]")
        for key, v in values.items():
            if not isinstance(v, dict):
                lines.append(f"{json.dumps(key) if '.' in key else key} = {value(v)}")
        lines.append("")
        for key, v in values.items():
            if isinstance(v, dict):  # a nested table: [index.redis]
                table(f"{title}.{key}", v)

    for section, values in config.items():
        table(section, values)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def process_config(
    bootstrap: str, topics: Topics, index: Path, port: int
) -> dict[str, dict[str, Any]]:
    """Settings for a service run as a subprocess (the TOML file's tables)."""
    return {
        "input": {"topics": [topics.input]},
        "index": {"path": str(index)},
        "http": {"port": port, "host": "127.0.0.1", "check_process": False},
        "batch": {"max_messages": 500, "max_wait_ms": 20},
        "service": {"shutdown_timeout_s": 20.0, "backoff_initial_s": 0.1},
        "log": {"level": "INFO", "format": "kv"},
        "kafka": {
            "bootstrap.servers": bootstrap,
            "group.id": topics.group,
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
        },
    }


#: ``stream-dedup run`` with 0.1 s added on each side of the point where a batch reaches
#: Kafka for good (the confirmation, or the transaction's commit), so that most of a busy
#: run is spent where a kill tests something: events produced but not committed (the
#: transaction is aborted, the batch replayed) and committed but not in the index (the
#: batch is stored at restart without emitting it again). Everything else is the real
#: service.
#: While a transaction's events are on the broker and not yet committed, the file
#: :func:`open_transaction_mark` names exists, so a test can aim a kill there. It is made
#: once the producer is flushed: ``produce`` only queues the events in the client, which
#: sends them a few milliseconds later (the partitions added to the transaction, then
#: ``linger.ms``), and a kill aimed at a mark made before that (it lands within ~2 ms)
#: usually left nothing on the broker to abort (2026-11-26, one instance, 8 aimed kills
#: at load 2 and 9: 6 left nothing; with the flush all 8 left the batch's events, which
#: the restarted instance aborted).
SLOW_COMMIT = """
import os, sys, time
from stream_dedup.cli import main
from stream_dedup.service import kafka, transactions

MARK = sys.argv[sys.argv.index("--config") + 1] + ".open-transaction"
if os.path.exists(MARK):  # left by a kill inside the transaction
    os.remove(MARK)

def slowed(cls, name, mark=False):
    original = getattr(cls, name)
    def slow(self, *args, **kwargs):
        if mark:
            self._producer.flush(30)  # the events on the broker, in the open transaction
            open(MARK, "w").close()
        time.sleep(0.1)
        try:
            original(self, *args, **kwargs)
        finally:
            if mark and os.path.exists(MARK):
                os.remove(MARK)
        time.sleep(0.1)
    setattr(cls, name, slow)

slowed(kafka.EventProducer, "confirm")
slowed(transactions.TransactionalProducer, "deliver", mark=True)
sys.exit(main(sys.argv[1:]))
"""


def open_transaction_mark(config: Path) -> Path:
    """The file a :data:`SLOW_COMMIT` service started with ``config`` holds while a
    transaction is open with its events on the broker."""
    return config.with_name(config.name + ".open-transaction")


def start_script(script: Path, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``script run --config FILE`` as a subprocess (a patched service), logs to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, str(script), "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


def kill_9_loop(
    start: Callable[[], subprocess.Popen[bytes]],
    port: int,
    kills: int,
    feeder: threading.Thread,
    rng: random.Random,
    jitter_s: float,
) -> int:
    """Start the service and ``kill -9`` it, ``kills`` times; returns the kills done.

    Each run is killed only once it has committed something (its indexed-documents gauge
    grew), or the feeder is done, and then at a random moment within ``jitter_s``: a kill
    before the first commit would test nothing the next kill does not. The gauge is polled
    every 10 ms so that a kill can land soon after a commit, inside the next batch.
    """
    done = 0
    while done < kills:
        proc = start()
        try:
            deadline = time.monotonic() + 30
            while scrape(port, "stream_dedup_index_documents") is None:
                assert time.monotonic() < deadline, "the service did not come up"
                time.sleep(0.05)
            first = scrape(port, "stream_dedup_index_documents") or 0.0
            deadline = time.monotonic() + 40
            while (scrape(port, "stream_dedup_index_documents") or 0.0) <= first:
                if not feeder.is_alive():
                    break
                assert time.monotonic() < deadline, "the service made no progress"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, jitter_s))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            done += 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def decision_order(index_path: Path) -> list[str]:
    """Ids in the order the service decided them: the index numbers documents that way."""
    index = open_index(index_path, None)
    try:
        n = index.counter("indexed")
        raw = index.read([keys.doc_key(i) for i in range(n)])
        assert index.intent() is None  # the clean stop committed everything announced
    finally:
        index.close()
    return [decode_doc(r).doc_id for r in raw if r is not None]


def offline_reference(
    docs: list[dict[str, str]], tmp_path: Path, *options: str
) -> dict[str, dict[str, object]]:
    """Verdicts of the offline ``dedup`` command (with ``options``) on the same documents,
    by id."""
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    out = tmp_path / "verdicts.jsonl"
    assert cli_main(["dedup", str(source), "-o", str(out), "-q", *options]) == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return {v["id"]: v for v in lines}


def assert_equal_to_offline_in_decision_order(
    by_id: dict[str, list[dict[str, Any]]],
    docs: list[dict[str, str]],
    index_path: Path,
    tmp_path: Path,
) -> list[str]:
    """Every id's first event equals the offline run over the documents in the order the
    service decided them (read from its index, since partitions interleave); returns it."""
    order = decision_order(index_path)
    assert sorted(order) == sorted(by_id)
    by_doc = {d["id"]: d for d in docs}
    reference = offline_reference([by_doc[i] for i in order], tmp_path)
    for doc_id, evs in by_id.items():
        ev, ref = evs[0], reference[doc_id]
        for field in ("verdict", "duplicate_of", "similarity", "cluster_id"):
            assert ev[field] == ref[field], (doc_id, field, ev[field], ref[field])
    return order
