"""A broker that is not there: one warning and summaries, not a line per reconnect attempt.

Nothing listens at the bootstrap address (a free loopback port), as when a new user starts
the service before the broker, or with a wrong address. librdkafka retries every second
or so and reports each failure; the service must log the outage once with what to check,
summarize while it lasts, and say when it ends (a broker is then started on that port).
``produce`` to a dead address must fail, within a bound, with a message of its own.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.kafka import build_consumer
from stream_dedup.tools.broker import EmbeddedBroker, free_port

from .support import (
    Topics,
    http_get,
    kijiji_documents,
    process_config,
    read_topic,
    scrape,
    write_toml,
)
from .test_process import start, wait_until

UNREACHABLE = 'msg="Kafka broker unreachable; waiting for it"'
#: How long the service runs with nothing at its bootstrap address.
OUTAGE_S = 12.0


def _own_broker_allowed() -> None:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("starts a broker on a port of its own; KAFKA_BOOTSTRAP_SERVERS names another")


@pytest.mark.slow
def test_run_without_a_broker_logs_the_outage_once_and_stops_cleanly(tmp_path: Path) -> None:
    kafka_port, http_port = free_port(), free_port()
    bootstrap = f"127.0.0.1:{kafka_port}"
    config = write_toml(
        tmp_path / "stream-dedup.toml",
        process_config(bootstrap, Topics.fresh(), tmp_path / "index", http_port),
    )
    log = tmp_path / "service.log"
    proc = start(config, log)
    try:
        wait_until(lambda: scrape(http_port, "stream_dedup_commits_total") is not None, 30, "HTTP")
        time.sleep(OUTAGE_S)
        assert proc.poll() is None, log.read_text()
        assert http_get(http_port, "/healthz")[0] == 200  # alive: nothing to restart
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    lines = log.read_text(encoding="utf-8").splitlines()
    # OUTAGE_S of reconnect attempts, one or two a second per client, made a few lines
    assert len(lines) < 10, "\n".join(lines)
    warnings = [ln for ln in lines if "level=warning" in ln]
    assert len(warnings) == 1 and UNREACHABLE in warnings[0], "\n".join(lines)
    assert f"bootstrap={bootstrap}" in warnings[0] and "check that a Kafka broker" in warnings[0]
    assert not [ln for ln in lines if "level=error" in ln or "Traceback" in ln]
    assert "msg=stopped" in lines[-1]


def produce_cli(
    tmp_path: Path, docs: list[dict[str, str]], topic: str, bootstrap: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    """``stream-dedup produce FILE --topic T --bootstrap-servers B`` as a subprocess."""
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    command = ["produce", str(source), "--topic", topic, "--bootstrap-servers", bootstrap]
    return subprocess.run(
        [sys.executable, "-m", "stream_dedup.cli", *command, *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


class _Records(logging.Handler):
    """Keeps every record of the loggers it is attached to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[_Records]:
    """The records of the Kafka edge and of librdkafka, whatever other tests set up."""
    handler = _Records()
    names = ("stream_dedup.service.kafka", "stream_dedup.librdkafka")
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for logger, _ in saved:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)


@pytest.mark.broker
@pytest.mark.slow
def test_an_outage_is_summarized_while_it_lasts_and_closed_when_it_ends(
    records: _Records,
) -> None:
    """A real consumer at a dead address: one warning, then summaries counting what they
    leave out, librdkafka's own lines held to debug; a broker on that port ends it."""
    _own_broker_allowed()
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    watch = BrokerWatch("consumer", summary_s=2.0)
    consumer = build_consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": Topics.fresh().group,
            "session.timeout.ms": "6000",
            "statistics.interval.ms": "500",
        },
        watch,
        stats_cb=lambda _payload: None,
    )
    consumer.subscribe([Topics.fresh().input])
    broker = EmbeddedBroker(port=port)
    try:
        started = time.monotonic()
        while time.monotonic() - started < 7.0:
            consumer.poll(0.2)
        assert watch.down_since is not None
        outage = list(records.records)
        broker.start()
        deadline = time.monotonic() + 30
        while watch.down_since is not None and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert watch.down_since is None, "the outage did not end once the broker answered"
    finally:
        consumer.close()
        broker.stop()

    loud = [r for r in outage if r.levelno >= logging.WARNING]
    messages = [r.getMessage() for r in loud]
    assert messages[0] == "Kafka broker unreachable; waiting for it", messages
    assert set(messages[1:]) == {"Kafka broker still unreachable"}, messages
    assert 2 <= len(messages) <= 5, messages  # one line, then one per 2 s, not per attempt
    suppressed = [r.fields["errors_suppressed"] for r in loud[1:]]
    assert all(n > 0 for n in suppressed), suppressed
    # librdkafka's FAIL line of each failed attempt: at debug level, and once per kind too
    fails = [
        r
        for r in outage
        if r.name.startswith("stream_dedup.librdkafka") and "FAIL" in r.getMessage()
    ]
    assert len(fails) == 1 and fails[0].levelno == logging.DEBUG
    recovered = [r for r in records.records if r.getMessage() == "Kafka broker reachable again"]
    assert len(recovered) == 1
    assert recovered[0].fields["down_s"] >= 7.0


def test_produce_to_no_broker_fails_in_bounded_time_with_what_to_do(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = produce_cli(tmp_path, kijiji_documents(20), "news", bootstrap)
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert elapsed < 30.0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: no Kafka broker answered at {bootstrap} within 10 s")
    assert "nothing was sent" in lines[0] and "--bootstrap-servers" in lines[0]


@pytest.mark.broker
def test_produce_to_a_live_broker_delivers_every_line_keyed_by_id(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    docs = kijiji_documents(120)
    done = produce_cli(tmp_path, docs, topics.input, bootstrap)
    assert done.returncode == 0, done.stderr
    assert "120 lines delivered" in done.stderr
    got = read_topic(bootstrap, topics.input, expected=len(docs))
    assert sorted(m.key() or b"" for m in got) == sorted(d["id"].encode() for d in docs)


@pytest.mark.broker
def test_produce_to_a_missing_topic_says_to_create_it(bootstrap: str, tmp_path: Path) -> None:
    topic = Topics.fresh().input  # never created; the broker may not create it on first use
    done = produce_cli(
        tmp_path,
        kijiji_documents(3),
        topic,
        bootstrap,
        "--set",
        "kafka.allow.auto.create.topics=false",
    )
    assert done.returncode == 2
    assert f"topic {topic!r} does not exist at {bootstrap}" in done.stderr
    assert "Create it first" in done.stderr
