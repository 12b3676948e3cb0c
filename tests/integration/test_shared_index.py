"""Two service instances of one consumer group sharing an index on a Redis Cluster,
killed with -9 in turn while documents flow.

Nothing may be lost, an id's events may repeat (at-least-once) but never contradict,
and the verdicts must equal a single-instance offline run over the documents in the
order the instances decided them (read back from the shared index).
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.tools.broker import free_port
from tests.conftest import fresh_namespace

from .instances import (
    instance_configs,
    kill_in_turn,
    kill_leftovers,
    mixed_stream,
    shared_order,
    slow_feeder,
    stop_all,
    up,
)
from .support import SLOW_COMMIT, Topics, offline_reference, read_topic, scrape, start_script
from .test_process import wait_until

# Under `make soak`: `make test` keeps the group-order and exactly-once kill loops
# (test_group_order.py, test_shared_exactly_once.py), which run several instances too.
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.soak]

DOCUMENTS = 1200
PARTITIONS = 4
KILLS = 10
BAD_EVERY = 100


def test_two_instances_killed_in_turn_lose_nothing_and_agree_with_one(
    bootstrap: str, redis_cluster_url: str, tmp_path: Path
) -> None:
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=PARTITIONS)
    docs, messages, bad = mixed_stream(tmp_path / "stream.jsonl", DOCUMENTS, BAD_EVERY)
    namespace = fresh_namespace()
    ports = [free_port(), free_port()]
    # Crash safety in lease order: the group's time order (test_group_order.py) would make
    # each slowed commit a turn of the group.
    redis = {
        "url": redis_cluster_url,
        "namespace": namespace,
        "lock_ttl_ms": 2000,
        "group_order": False,
    }
    configs = instance_configs(bootstrap, topics, redis, ports, tmp_path)
    script = tmp_path / "slow_commit.py"
    script.write_text(SLOW_COMMIT, encoding="utf-8")
    log = tmp_path / "service.log"

    def start(n: int) -> subprocess.Popen[bytes]:
        return start_script(script, configs[n], log)

    procs = [start(0), start(1)]
    feeder = slow_feeder(bootstrap, topics.input, messages)
    try:
        for port in ports:
            wait_until(lambda p=port: up(p), 60, "both instances up")
        feeder.start()
        kills = kill_in_turn(procs, ports, start, KILLS, feeder, random.Random(5))
        feeder.join(timeout=300)
        assert not feeder.is_alive()
        good = DOCUMENTS
        wait_until(
            lambda: max(scrape(p, "stream_dedup_index_documents") or 0 for p in ports) >= good,
            120,
            "every document decided",
        )
        assert stop_all(procs, ports) == [0, 0]
    finally:
        kill_leftovers(procs)
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
