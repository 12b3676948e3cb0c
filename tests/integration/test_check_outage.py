"""The check process rides out an outage of the shared index's Redis, as the service does:
it stays up, refuses checks with 503 meanwhile, and answers again once Redis is back,
without spending the service's ``http.check_restarts``. A check process started while
Redis is down waits for it instead of dying at once.

Real broker (Tansu) and a real Redis that persists every command (AOF), stopped and
started again on the same port as a restart or failover does.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.service.config import RedisConfig
from tests.conftest import fresh_namespace

from .support import ServiceThread, Topics, http_get, kijiji_documents, make_config, produce_json
from .test_check_http import check_port, post, start, wait_followed

pytestmark = pytest.mark.broker

DOCS = kijiji_documents(120)


def wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def check_ready(svc: ServiceThread) -> int:
    """The check process's own /readyz status (0 when it does not answer at all)."""
    try:
        return http_get(check_port(svc), "/readyz")[0]
    except OSError:
        return 0


def answered(svc: ServiceThread) -> tuple[int, Any]:
    """A check of a document the index holds."""
    return post(check_port(svc), "/check?k=1", {"id": "q", "title": DOCS[7]["title"]})


@pytest.fixture
def service(bootstrap: str, topics: Topics, tmp_path: Path, node: Any) -> Any:
    config = make_config(bootstrap, topics, tmp_path / "unused", http={"check_process": True})
    shared = RedisConfig(
        url=node.url, namespace=fresh_namespace(), lock_ttl_ms=2000, outage_limit_s=60.0
    )
    config = replace(config, index=replace(config.index, backend="redis", redis=shared))
    svc = start(config)
    try:
        produce_json(bootstrap, topics.input, DOCS)
        svc.wait_for("stream_dedup_messages_consumed_total", len(DOCS))
        wait_followed(svc, len(DOCS))
        code, body = answered(svc)
        assert code == 200 and body["matches"][0]["similarity"] == 1.0
        yield svc
    finally:
        svc.stop()


def test_a_redis_outage_leaves_the_check_process_up_refusing_then_answering(
    service: ServiceThread, node: Any
) -> None:
    checks = service.service.checks
    assert checks is not None
    pid = checks.pid
    node.stop()
    wait_until(lambda: check_ready(service) == 503, 15, "the check process never noticed")
    code, body = answered(service)
    assert code == 503 and body["error"] == "unavailable", body
    time.sleep(3)  # several follows fail meanwhile
    assert checks.pid == pid and checks.state == "serving"  # not died, not restarted
    assert service.metric("stream_dedup_check_process_restarts_total") == 0

    node.start()
    wait_until(lambda: check_ready(service) == 200, 30, "checks not answered after the outage")
    code, body = answered(service)
    assert code == 200 and body["matches"][0]["similarity"] == 1.0
    assert checks.pid == pid
    _, ready = http_get(check_port(service), "/readyz")
    assert json.loads(ready)["documents"] == len(DOCS)


def test_a_check_process_started_during_an_outage_waits_for_redis(
    service: ServiceThread, node: Any
) -> None:
    checks = service.service.checks
    assert checks is not None and checks.pid is not None
    node.stop()
    os.kill(checks.pid, signal.SIGKILL)  # the service starts it again, Redis still down
    wait_until(
        lambda: service.metric("stream_dedup_check_process_restarts_total") == 1,
        15,
        "the check process was not started again",
    )
    time.sleep(4)  # a new process that died at each try would have spent several restarts
    assert service.metric("stream_dedup_check_process_restarts_total") == 1
    assert checks.state == "restarting"
    assert check_ready(service) != 200

    node.start()
    wait_until(lambda: checks.state == "serving", 60, "the new process never served")
    code, body = answered(service)
    assert code == 200 and body["matches"][0]["similarity"] == 1.0
    assert service.metric("stream_dedup_check_process_restarts_total") == 1
