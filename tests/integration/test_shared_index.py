"""Two service instances of one consumer group sharing an index on a Redis Cluster,
killed with -9 in turn while documents flow.

Nothing may be lost, an id's events may repeat (at-least-once) but never contradict,
and the verdicts must equal a single-instance offline run over the documents in the
order the instances decided them (read back from the shared index).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.index import DedupIndex
from stream_dedup.index.records import decode_doc
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.tools.broker import free_port
from stream_dedup.tools.generate import StreamSpec, write_jsonl
from tests.conftest import fresh_namespace

from .support import (
    SLOW_COMMIT,
    Topics,
    offline_reference,
    process_config,
    produce,
    read_topic,
    scrape,
    start_script,
    write_toml,
)
from .test_process import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DOCUMENTS = 1200
PARTITIONS = 4
KILLS = 10
BAD_EVERY = 100


def shared_order(url: str, namespace: str) -> list[str]:
    """Ids in the order the instances decided them: the shared index numbers documents so."""
    index = DedupIndex(RedisBackend(url, namespace=namespace), None)
    try:
        n = index.counter("indexed")
        raw = index.read_documents(list(range(n)))
    finally:
        index.close()
    return [decode_doc(r).doc_id for r in raw if r is not None]


def test_two_instances_killed_in_turn_lose_nothing_and_agree_with_one(
    bootstrap: str, redis_cluster_url: str, tmp_path: Path
) -> None:
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=PARTITIONS)
    stream = tmp_path / "stream.jsonl"
    with stream.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=DOCUMENTS, seed=23), fh)
    docs = [json.loads(line) for line in stream.read_text().splitlines()]
    messages: list[bytes] = []
    for i, doc in enumerate(docs):
        if i % BAD_EVERY == BAD_EVERY - 1:
            messages.append(f'{{"id": "bad-{i}", "text": '.encode())
        messages.append(json.dumps(doc).encode())
    bad = {m for m in messages if m.startswith(b'{"id": "bad-')}

    def feed() -> None:  # ~30 messages/s, keyed over the partitions: copies cross instances
        for i in range(0, len(messages), 10):
            chunk = enumerate(messages[i : i + 10], start=i)
            produce(bootstrap, topics.input, ((str(n).encode(), m, None) for n, m in chunk))
            time.sleep(0.3)

    namespace = fresh_namespace()
    ports = [free_port(), free_port()]
    script = tmp_path / "slow_commit.py"
    script.write_text(SLOW_COMMIT, encoding="utf-8")
    configs = []
    for n, port in enumerate(ports):
        settings = process_config(bootstrap, topics, tmp_path / f"unused-{n}", port)
        settings["index"] = {
            "backend": "redis",
            # Crash safety in lease order: the group's time order (test_group_order.py)
            # would make each slowed commit a turn of the group.
            "redis": {
                "url": redis_cluster_url,
                "namespace": namespace,
                "lock_ttl_ms": 2000,
                "group_order": False,
            },
        }
        settings["kafka"]["partition.assignment.strategy"] = "cooperative-sticky"
        configs.append(write_toml(tmp_path / f"instance-{n}.toml", settings))
    log = tmp_path / "service.log"

    def start(n: int) -> subprocess.Popen[bytes]:
        return start_script(script, configs[n], log)

    procs = [start(0), start(1)]
    rng = random.Random(5)
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        for port in ports:
            wait_until(lambda p=port: scrape(p, "stream_dedup_index_documents") is not None,
                       60, "both instances up")  # fmt: skip
        feeder.start()
        kills = 0
        while kills < KILLS:
            n = kills % 2  # in turn: each kill lands while the other instance runs
            before = scrape(ports[n], "stream_dedup_commits_total") or 0.0
            deadline = time.monotonic() + 40
            while (scrape(ports[n], "stream_dedup_commits_total") or 0.0) <= before:
                if not feeder.is_alive():
                    break
                assert time.monotonic() < deadline, f"instance {n} made no progress"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.4))
            procs[n].send_signal(signal.SIGKILL)
            procs[n].wait(timeout=10)
            kills += 1
            procs[n] = start(n)
            wait_until(lambda p=ports[n]: scrape(p, "stream_dedup_index_documents") is not None,
                       60, "the instance back")  # fmt: skip
        feeder.join(timeout=300)
        assert not feeder.is_alive()
        good = DOCUMENTS
        wait_until(
            lambda: max(scrape(p, "stream_dedup_index_documents") or 0 for p in ports) >= good,
            120,
            "every document decided",
        )
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(timeout=40) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"{kills} kills; feeder still running at the last: {feeder.is_alive()}")

    msgs = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
    out = [json.loads(m.value() or b"null") for m in msgs]
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in out:
        by_id[ev["id"]].append(ev)
    assert set(by_id) == {d["id"] for d in docs}  # nothing lost
    for doc_id, evs in by_id.items():  # repeats (at-least-once) never contradict
        assert all(e == evs[0] for e in evs), doc_id
    dead = {m.value() for m in read_topic(bootstrap, topics.dlq, len(bad))}
    assert dead == bad

    order = shared_order(redis_cluster_url, namespace)
    assert sorted(order) == sorted(by_id)  # every document decided exactly once
    by_doc = {d["id"]: d for d in docs}
    reference = offline_reference([by_doc[i] for i in order], tmp_path)
    fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
    agree = sum(all(by_id[i][0][f] == reference[i][f] for f in fields) for i in by_id)
    (tmp_path / "produce-order").mkdir()
    in_time = offline_reference(docs, tmp_path / "produce-order")
    agree_time = sum(by_id[i][0]["duplicate_of"] == in_time[i]["duplicate_of"] for i in by_id)
    print(f"agreement with one instance: {agree / len(by_id):.4f} in decision order, "
          f"{agree_time / len(by_id):.4f} (duplicate_of) in produce order")  # fmt: skip
    assert agree >= 0.995 * len(by_id)
