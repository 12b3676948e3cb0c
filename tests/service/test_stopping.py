"""A stop asked for at any time is honoured: before the service starts a Kafka client, while
it builds its key filter, and with SIGINT inherited as ignored (a background job)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream_dedup.index import epoch_filters, store
from stream_dedup.models import Document
from stream_dedup.service.config import (
    HttpConfig,
    IndexConfig,
    InputConfig,
    ServiceConfig,
)
from stream_dedup.service.loop import Service
from stream_dedup.service.stopping import StopRequest
from stream_dedup.tools.broker import free_port


def _config(tmp_path: Path) -> ServiceConfig:
    """Nothing listens at the bootstrap address: a Kafka client would only wait."""
    return ServiceConfig(
        kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}", "group.id": "stopping"},
        input=InputConfig(topics=("news",)),
        index=IndexConfig(path=str(tmp_path / "index")),
        http=HttpConfig(enabled=False),
    )


def test_a_stop_request_remembers_its_first_time() -> None:
    stop = StopRequest()
    assert not stop.is_set() and stop.waited_s() is None
    stop.request()
    time.sleep(0.05)
    first = stop.waited_s()
    stop.request()  # a second request does not restart the clock
    assert stop.is_set() and stop.event.is_set()
    assert first is not None and (stop.waited_s() or 0.0) >= first >= 0.05


def test_a_stop_before_run_starts_no_kafka_client(
    tmp_path: Path, package_logs: list[logging.LogRecord]
) -> None:
    stop = StopRequest()
    svc = Service(_config(tmp_path), stop=stop)
    stop.request()  # as SIGTERM while the index was being opened
    started = time.monotonic()
    assert svc.run() == 0
    assert time.monotonic() - started < 10.0
    assert svc._life is None  # never subscribed
    messages = [r.getMessage() for r in package_logs]
    assert "stop requested while starting; no Kafka client was started" in messages
    assert not svc.ready()[0]
    Service(_config(tmp_path)).index.close()  # the index was closed: it opens again


def test_a_stop_while_the_key_filter_is_built_keeps_what_was_built_and_loses_no_key(
    tmp_path: Path,
    kijiji_ads: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(tmp_path)
    first = Service(config)
    docs = [Document(i, c) for i, c in kijiji_ads[:600]]
    for lo in range(0, len(docs), 200):
        first.dedup.process(docs[lo : lo + 200])
    first.index.close()
    (tmp_path / "index" / store.FILTER_FILE).unlink()  # as a killed service leaves it
    full = Service(config)
    keys = full.index.load_filter().count  # what a whole build holds
    full.index.close()
    for saved in (tmp_path / "index").glob("*filter*"):
        saved.unlink()  # the next start builds again

    monkeypatch.setattr(epoch_filters, "_FILTER_CHUNK", 100)  # many progress calls
    stop = StopRequest()
    svc = Service(config, stop=stop)
    calls = 0
    progress = svc._filter_progress

    def stop_midway(added: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            stop.request()
        progress(added)

    monkeypatch.setattr(svc, "_filter_progress", stop_midway)
    assert svc.run() == 0
    assert calls == 3  # the build stopped at the request, not at its end

    again = Service(config)  # builds what is missing: every committed key is there
    try:
        assert again.index.load_filter().count == keys
        copies = [Document(f"copy-{i}", c) for i, c in kijiji_ads[:600]]
        verdicts = again.dedup.process(copies).verdicts
        assert all(v.is_duplicate for v in verdicts)
    finally:
        again.index.close()


@pytest.mark.slow
def test_sigint_stops_the_service_even_when_inherited_as_ignored(tmp_path: Path) -> None:
    """A background job of a script starts with SIGINT ignored: ``run`` handles it anyway."""
    http_port = free_port()
    log = tmp_path / "service.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "stream_dedup.cli", "run"),
                *("--bootstrap-servers", f"127.0.0.1:{free_port()}", "--topics", "news"),
                *("--index", str(tmp_path / "index"), "--http-port", str(http_port)),
                *("--set", "kafka.group.id=stopping", "--set", "http.check_port=0"),
                *("--log-level", "INFO"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        deadline = time.monotonic() + 60
        while '"msg": "started"' not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert '"msg": "started"' in log.read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=25) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(
        line["msg"] == "stop requested" and line.get("signal") == "SIGINT" for line in lines
    ), lines
    assert lines[-1]["msg"] == "stopped"
