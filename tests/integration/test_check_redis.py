"""The check process of a service whose index is on Redis (``index.backend = "redis"``):
it answers from a Redis client of its own, as the Python API would, follows the commits
the service makes after it started, and changes no key of the index."""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from stream_dedup.service.config import RedisConfig
from tests.conftest import fresh_namespace

from .support import ServiceThread, Topics, kijiji_documents, make_config, produce_json
from .test_check_http import check_metric, check_port, offline_answers, post, start, wait_followed
from .test_exactly_once import group_offsets

pytestmark = pytest.mark.broker

DOCS = kijiji_documents()


def index_digest(url: str, namespace: str) -> tuple[int, str]:
    """How many keys the index has on Redis, and a digest of every key, its type and its
    content, so that a change of any of them shows. (Not ``DUMP``: a read may move a
    large hash's incremental rehashing on, which reorders its dump, not its content.)"""
    client = redis.Redis.from_url(url)
    try:
        names = sorted(
            {*client.scan_iter(match=f"{{{namespace}}}:*"), *client.scan_iter(f"{namespace}:*")}
        )
        digest = hashlib.sha256()
        for name in names:
            kind = client.type(name)
            digest.update(name + b"\0" + kind + b"\0" + repr(_content(client, name, kind)).encode())
        return len(names), digest.hexdigest()
    finally:
        client.close()


def _content(client: redis.Redis, name: bytes, kind: bytes) -> object:
    """A key's value in a canonical order."""
    if kind == b"string":
        return client.get(name)
    if kind == b"hash":
        return sorted(client.hgetall(name).items())
    if kind == b"set":
        return sorted(client.smembers(name))
    if kind == b"zset":
        return client.zrange(name, 0, -1, withscores=True)
    if kind == b"list":
        return client.lrange(name, 0, -1)
    raise AssertionError(f"a key of type {kind!r} in the index: {name!r}")


def wait_applied(url: str, namespace: str, timeout_s: float = 30) -> None:
    """Until no write waits to be applied (the service applies each write on a thread of
    its own after the batch is committed)."""
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout_s
        while client.hlen(f"{{{namespace}}}!redos"):
            assert time.monotonic() < deadline, "a write was not applied"
            time.sleep(0.02)
    finally:
        client.close()


def wait_committed(
    svc: ServiceThread, bootstrap: str, topics: Topics, documents: int, timeout_s: float = 60
) -> None:
    """Until the service's index holds ``documents`` and their batches are delivered:
    a shared index stores a batch's documents first and its offsets only once the
    broker confirmed the events, at the loop's next turn, and the group's offsets are
    committed last. Waiting for the index's count alone would let the offsets' write
    land inside a check that asserts no key changes."""
    deadline = time.monotonic() + timeout_s
    while svc.service.index.counter("documents") < documents:
        assert time.monotonic() < deadline, "the service did not store the documents"
        time.sleep(0.05)
    while group_offsets(bootstrap, topics)[0] < documents:
        assert time.monotonic() < deadline, "the service did not commit the offsets"
        time.sleep(0.05)


def test_the_check_process_answers_from_a_redis_index_and_changes_no_key(
    bootstrap: str, topics: Topics, tmp_path: Path, redis_url: str
) -> None:
    namespace = fresh_namespace()
    config = make_config(bootstrap, topics, tmp_path / "unused", http={"check_process": True})
    shared = RedisConfig(url=redis_url, namespace=namespace)
    config = replace(config, index=replace(config.index, backend="redis", redis=shared))
    svc = start(config)
    try:
        checks = svc.service.checks
        assert checks is not None and checks.state == "serving"
        first, second = DOCS[:800], DOCS[800:1200]
        produce_json(bootstrap, topics.input, first)
        wait_committed(svc, bootstrap, topics, len(first))
        wait_followed(svc, len(first))
        port = check_port(svc)
        wait_applied(redis_url, namespace)
        asked = [{"id": f"q{i}", "title": d["title"].upper()} for i, d in enumerate(first[:40])]
        expected = offline_answers(first, [a["title"] for a in asked], k=3)
        before = index_digest(redis_url, namespace)
        assert before[0] > 100  # the index is there, under its namespace (hashes of records)
        code, body = post(port, "/check/batch?k=3", asked)
        assert code == 200
        assert [a["matches"] for a in body["answers"]] == expected
        assert sum(len(m) > 1 for m in expected) > 3  # some have near-duplicates besides
        code, one = post(port, "/check?k=3", asked[5])
        assert code == 200 and one == body["answers"][5]
        assert one["matches"][0]["similarity"] == 1.0
        code, new = post(port, "/check", {"id": "new", "title": "zebra crossing tuba 42"})
        assert (code, new) == (200, {"id": "new", "matches": []})
        assert index_digest(redis_url, namespace) == before  # no key written, none changed
        assert check_metric(svc, "stream_dedup_check_requests_total", {"outcome": "ok"}) == 3

        # Commits made after the process started: it follows them (the service's notice,
        # then the counters re-read from Redis), and finds the new documents.
        produce_json(bootstrap, topics.input, second)
        wait_committed(svc, bootstrap, topics, len(first) + len(second))
        wait_followed(svc, len(first) + len(second))
        late = {"id": "late", "title": second[-1]["title"]}
        code, found = post(port, "/check?k=1", late)
        assert code == 200
        assert found["matches"][0]["similarity"] == 1.0
        expected_late = offline_answers(first + second, [late["title"]], k=1)[0]
        assert found["matches"] == expected_late
        # each follow timed (at least the one after the service's notice of the commit)
        assert check_metric(svc, "stream_dedup_check_follow_seconds_count") >= 1
    finally:
        svc.stop()
