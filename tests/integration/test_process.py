"""The service as an operator runs it: a subprocess, its HTTP port, signals, one writer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream_dedup.index.filter import BITS_PER_KEY, MIN_CAPACITY
from stream_dedup.tools.broker import free_port

from .support import (
    ServiceThread,
    Topics,
    http_get,
    kijiji_documents,
    make_config,
    process_config,
    produce_json,
    scrape,
    write_toml,
)

pytestmark = pytest.mark.broker


def start(config_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """``stream-dedup run --config FILE`` as a subprocess, its logs appended to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "stream_dedup.cli", "run", "--config", str(config_file)],
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


def wait_until(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_second_instance_refuses_and_sigterm_stops_cleanly(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    port = free_port()
    config = write_toml(
        tmp_path / "stream-dedup.toml",
        process_config(bootstrap, topics, tmp_path / "index", port),
    )
    docs = kijiji_documents(300)
    log = tmp_path / "service.log"
    proc = start(config, log)
    try:
        wait_until(lambda: scrape(port, "stream_dedup_commits_total") is not None, 30, "HTTP")
        wait_until(lambda: http_get(port, "/readyz")[0] == 200, 30, "/readyz")
        produce_json(bootstrap, topics.input, docs)
        wait_until(
            lambda: scrape(port, "stream_dedup_index_documents") == len(docs), 30, "documents"
        )
        status, body = http_get(port, "/healthz")
        assert status == 200 and '"status": "ok"' in body
        _, metrics = http_get(port, "/metrics")
        assert 'stream_dedup_dead_letters_total{reason="too_large"} 0.0' in metrics
        assert f"stream_dedup_messages_consumed_total {float(len(docs))}" in metrics
        assert (scrape(port, "stream_dedup_index_size_bytes") or 0) > 0

        again = [sys.executable, "-m", "stream_dedup.cli", "run", "--config", str(config)]
        busy = subprocess.run(again, capture_output=True, text=True, timeout=60)
        assert busy.returncode == 2  # the port is bound before the index is opened
        assert f"'http.port': cannot listen on 127.0.0.1:{port}" in busy.stderr
        # On a port of its own, the second instance finds the index locked.
        second = subprocess.run(
            [*again, "--http-port", "0"], capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 3
        assert "already open by another process" in second.stderr
        assert "one writer" in second.stderr

        started = time.monotonic()
        proc.terminate()  # SIGTERM
        code = proc.wait(timeout=25)
        assert code == 0, log.read_text()
        assert time.monotonic() - started < 25
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "msg=stopped" in log.read_text()


def test_metrics_and_health_in_process(bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    docs = kijiji_documents(400)
    svc = ServiceThread(make_config(bootstrap, topics, tmp_path / "index"))
    assert svc.service.ready()[0] is False  # no partitions yet
    svc.start()
    produce_json(bootstrap, topics.input, docs)
    svc.wait_for("stream_dedup_index_documents", len(docs))
    m = svc.metric
    # Verdicts are counted after the Kafka offset commit, the last step of a checkpoint,
    # which follows the index write that the documents gauge reads.
    wait_until(
        lambda: (
            m("stream_dedup_verdicts_total", {"verdict": "unique"})
            + m("stream_dedup_verdicts_total", {"verdict": "duplicate"})
            >= len(docs)
        ),
        30,
        "verdict counters",
    )
    unique = m("stream_dedup_verdicts_total", {"verdict": "unique"})
    duplicate = m("stream_dedup_verdicts_total", {"verdict": "duplicate"})
    assert unique + duplicate == len(docs) and duplicate > 0
    assert m("stream_dedup_index_documents") == len(docs)
    assert m("stream_dedup_index_size_bytes") > 0
    assert m("stream_dedup_index_filter_bytes") == MIN_CAPACITY * BITS_PER_KEY // 8
    assert m("stream_dedup_candidates_per_document_count") == len(docs)
    assert m("stream_dedup_verifications_per_document_count") == len(docs)
    assert m("stream_dedup_document_latency_seconds_count") == len(docs)
    assert m("stream_dedup_commits_total") >= 1
    # Each document sketched once: by the worker, or here (the first batch, or its first
    # third, is sketched here while the worker would be idle).
    sketched = [
        m("stream_dedup_sketched_documents_total", {"by": b}) for b in ("worker", "service")
    ]
    assert sum(sketched) == len(docs) and sketched[1] > 0
    assert m("stream_dedup_commit_duration_seconds_count") == m("stream_dedup_commits_total")
    assert m("stream_dedup_batch_duration_seconds_count") >= 1
    assert m("stream_dedup_rebalances_total", {"kind": "assign"}) >= 1
    assert m("stream_dedup_assigned_partitions") == 1
    for reason in ("invalid_json", "too_large", "processing_error"):
        assert (
            svc.registry.get_sample_value("stream_dedup_dead_letters_total", {"reason": reason})
            == 0
        )
    # lag comes from librdkafka statistics (every 500 ms in tests)
    wait_until(
        lambda: (
            svc.registry.get_sample_value(
                "stream_dedup_consumer_lag_messages", {"topic": topics.input, "partition": "0"}
            )
            == 0
        ),
        15,
        "lag statistics",
    )
    assert svc.service.health()[0] is True
    assert svc.service.ready() == (True, {"partitions": 1, "index_open": True})
    assert svc.service.http is not None
    port = svc.service.http.port
    assert http_get(port, "/readyz")[0] == 200
    assert http_get(port, "/healthz")[0] == 200
    assert http_get(port, "/nope")[0] == 404
    assert svc.stop() == 0
    assert svc.service.ready()[0] is False
