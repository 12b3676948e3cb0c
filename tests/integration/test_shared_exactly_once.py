"""Exactly-once delivery on the shared index: two instances of one group on one Redis
(a node and a 3-master cluster), killed with -9 in turn while documents flow.

A ``read_committed`` reader must see exactly one event per document and one dead letter
per malformed message, though kills land inside open transactions (aborted, the batch
replayed by whoever owns its partitions next) and between a batch's store in Redis and its
transaction (the replay re-emits the stored verdicts). Every verdict equals the offline
single-instance run over the documents in the order the instances decided them (read back
from the index), as ``test_shared_index.py`` asks of at-least-once delivery.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from stream_dedup.index import open_index
from stream_dedup.index.opener import RedisSettings
from stream_dedup.index.params import IndexParams
from stream_dedup.service.config import RedisConfig
from stream_dedup.tools.broker import free_port
from tests.conftest import fresh_namespace

from .committed_reader import read_committed
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
from .support import (
    SLOW_COMMIT,
    ServiceThread,
    Topics,
    kijiji_documents,
    make_config,
    offline_reference,
    open_transaction_mark,
    produce,
    scrape,
    start_script,
)
from .test_process import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DOCUMENTS = 900
PARTITIONS = 4
KILLS = 10
BAD_EVERY = 100


@pytest.mark.parametrize(
    "redis",
    [
        "redis_cluster_url",
        # a node adds no crash point a cluster lacks; ~2 minutes more, so `make soak` only
        pytest.param("redis_url", marks=pytest.mark.soak),
    ],
)
def test_two_instances_killed_in_turn_commit_each_event_once(
    bootstrap: str, redis: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(redis)
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=PARTITIONS)
    docs, messages, bad = mixed_stream(tmp_path / "stream.jsonl", DOCUMENTS, BAD_EVERY)
    namespace = fresh_namespace()
    ports = [free_port(), free_port()]
    configs = instance_configs(
        bootstrap,
        topics,
        # Lease order: the slowed commits place kills inside open transactions; under the
        # group's time order each would be a turn of the group and the kills' timing is
        # lost (the order under kills is test_group_order.py's).
        {"url": url, "namespace": namespace, "lock_ttl_ms": 2000, "group_order": False},
        ports,
        tmp_path,
        # one transactional.id per instance, the same across its restarts (given, not
        # derived from group.instance.id: static membership on the broker for tests left
        # restarted instances without partitions for long stretches)
        kafka=lambda n: {"transactional.id": f"{topics.group}-{n}"},
        service={"delivery": "exactly-once"},
    )
    script = tmp_path / "slow_commit.py"
    script.write_text(SLOW_COMMIT, encoding="utf-8")
    log = tmp_path / "service.log"

    def start(n: int) -> subprocess.Popen[bytes]:
        return start_script(script, configs[n], log)

    procs = [start(0), start(1)]
    feeder = slow_feeder(bootstrap, topics.input, messages, pause_s=0.8)
    try:
        for port in ports:
            wait_until(lambda p=port: up(p), 60, "both instances up")
        feeder.start()
        kills = kill_in_turn(
            procs,
            ports,
            start,
            KILLS,
            feeder,
            random.Random(5),
            progress="stream_dedup_messages_consumed_total",  # kill inside a batch's commit
            jitter_s=0.3,
            # and every third kill inside an open transaction: its replay is tested
            aim=lambda n: open_transaction_mark(configs[n]).exists(),
        )
        feeder.join(timeout=120)
        assert not feeder.is_alive()
        wait_until(
            lambda: max(scrape(p, "stream_dedup_index_documents") or 0 for p in ports) >= DOCUMENTS,
            120,
            "every document decided",
        )
        assert stop_all(procs, ports) == [0, 0]
    finally:
        kill_leftovers(procs)
    assert kills == KILLS

    logs = [read_committed(bootstrap, t) for t in (topics.unique, topics.duplicates)]
    out = [json.loads(v or b"null") for log_ in logs for _k, v in log_.committed]
    counts = Counter(ev["id"] for ev in out)
    assert set(counts) == {d["id"] for d in docs}  # nothing lost
    assert set(counts.values()) == {1}, counts.most_common(3)  # nothing committed twice
    dead = read_committed(bootstrap, topics.dlq)
    assert sorted(v or b"" for _k, v in dead.committed) == sorted(bad)
    aborted = sum(log_.aborted for log_ in logs) + dead.aborted
    markers = [(log_.commits, log_.aborts) for log_ in (*logs, dead)]
    print(f"{kills} kills; records of aborted transactions: {aborted}; markers {markers}")
    # kills landed inside open transactions (every third one aimed there, once its events
    # are on the broker): their replays are tested
    assert aborted > 0, f"no aborted transaction had records; (commit, abort) markers {markers}"

    order = shared_order(url, namespace)
    assert sorted(order) == sorted(counts)  # every document decided (stored) once
    by_doc = {d["id"]: d for d in docs}
    reference = offline_reference([by_doc[i] for i in order], tmp_path)
    fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
    agree = sum({f: ev[f] for f in fields} == {f: reference[ev["id"]][f] for f in fields}
                for ev in out)  # fmt: skip
    print(f"agreement with one instance in decision order: {agree / len(out):.4f}")
    assert agree >= 0.995 * len(out)  # as at-least-once (test_shared_index.py)


def test_a_partition_resumes_where_the_group_or_the_index_is_further(
    bootstrap: str, redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The index's offsets are written only after their transaction committed, so where
    they are ahead of the group's the broker did not keep a commit's offsets (or the last
    run delivered at least once): the partition resumes there, not at the group's, which
    would commit those events twice. Where the group is ahead, it resumes at the group's."""
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=2)
    docs = kijiji_documents(40)
    per_partition = {0: docs[:20], 1: docs[20:]}
    for p, part in per_partition.items():
        produce(bootstrap, topics.input, ((None, json.dumps(d).encode(), None) for d in part), p)
    group_at, index_at = {0: 5, 1: 15}, {0: 12, 1: 8}
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group})
    try:
        committer.commit(
            offsets=[TopicPartition(topics.input, p, o) for p, o in group_at.items()],
            asynchronous=False,
        )
    finally:
        committer.close()
    namespace = fresh_namespace()
    config = make_config(
        bootstrap,
        topics,
        tmp_path / "unused",
        service={"delivery": "exactly-once"},
        kafka={"transactional.id": f"{topics.group}-0"},
    )
    redis = RedisConfig(redis_url, namespace=namespace)
    config = replace(config, index=replace(config.index, backend="redis", redis=redis))
    index = open_index(RedisSettings(redis_url, namespace), IndexParams.of(config.dedup))
    try:
        index.write_offsets({(topics.input, p): o for p, o in index_at.items()})
    finally:
        index.close()
    expected = {
        d["id"] for p, part in per_partition.items() for d in part[max(group_at[p], index_at[p]) :]
    }

    with caplog.at_level("WARNING", logger="stream_dedup.service"):
        service = ServiceThread(config).start()
        try:
            service.wait_for("stream_dedup_index_documents", len(expected))
        finally:
            assert service.stop() == 0
    logs = [read_committed(bootstrap, t) for t in (topics.unique, topics.duplicates)]
    decided = Counter(json.loads(v or b"null")["id"] for log_ in logs for _k, v in log_.committed)
    assert decided == Counter(expected)  # each once, and none before the later offset
    warned = [r for r in caplog.records if "ahead of the consumer group" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].fields["partitions"] == {f"{topics.input}:0": [5, 12]}  # type: ignore[attr-defined]
