"""`stream-dedup demo` runs the whole service end to end and reports what it did."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest

from stream_dedup.cli.app import main
from stream_dedup.tools.broker import free_port

from .support import read_topic

pytestmark = pytest.mark.broker


def test_demo_streams_the_sample_through_the_service_and_summarises() -> None:
    out = StringIO()
    assert main(["demo", "-n", "400", "--http-port", "0"], out=out) == 0
    text = out.getvalue()
    docs = int(re.search(r"documents\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    unique = int(re.search(r"unique\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    dup = int(re.search(r"duplicate\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    dead = int(re.search(r"dead-lettered\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert docs == 400 and unique + dup == 400
    assert dup > 50, "the sample is built with many re-runs"
    assert dead == 4, "each deliberately malformed message is dead-lettered"
    clusters = re.findall(r"^\s+(\d+) re-runs of (doc-\d+)", text, re.M)
    assert 1 <= len(clusters) <= 5
    counts = [int(c) for c, _ in clusters]
    assert counts == sorted(counts, reverse=True) and counts[0] >= 2
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", text)
    assert "service stopped cleanly" in text


def test_run_and_produce_against_the_demo_broker(tmp_path: Path) -> None:
    """``demo --broker-only`` keeps the embedded broker up and prints the ``run`` and
    ``produce`` commands that use it; those commands, as printed, decide a stream."""
    port = free_port()
    cli = [sys.executable, "-m", "stream_dedup.cli"]
    broker = subprocess.Popen(
        [*cli, "demo", "--broker-only", "--broker-port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    service: subprocess.Popen[str] | None = None
    try:
        assert broker.stdout is not None
        printed = [broker.stdout.readline() for _ in range(3)]
        run_line, produce_line = printed[1].split(), printed[2].split("|")[1].split()
        bootstrap = f"127.0.0.1:{port}"
        assert run_line[:4] == ["stream-dedup", "run", "--bootstrap-servers", bootstrap]
        stream = tmp_path / "stream.jsonl"
        assert main(["generate", "-n", "300", "-o", str(stream)]) == 0
        assert main([produce_line[1], str(stream), *produce_line[3:]]) == 0
        log = tmp_path / "run.log"
        with log.open("w") as sink:
            service = subprocess.Popen(
                [*cli, *run_line[1:], "--index", "index", "--http-port", "0"],
                cwd=tmp_path,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
            )
        decided = read_topic(bootstrap, "news.unique", 1) + read_topic(
            bootstrap, "news.duplicates", 1
        )
        assert len(decided) == 300
        service.send_signal(signal.SIGINT)
        assert service.wait(60) == 0
        assert "joining the consumer group" in log.read_text()
    finally:
        if service is not None and service.poll() is None:
            service.kill()
        broker.send_signal(signal.SIGTERM)
        out, _ = broker.communicate(timeout=60)
    assert broker.returncode == 0
    assert "broker stopped" in out
