"""``kill -9`` with several input partitions: a replayed batch is the batch first emitted.

With one partition a re-read batch can only grow at its end; with several, the consumer
may interleave partitions differently after a restart. The batch intent and the canonical
time order make the replay decide the same documents in the same order, so every
``duplicate_of`` is the one already emitted. Both delivery modes; exactly-once is read as
``read_committed`` defines it (:mod:`.committed_reader`) and holds one event per id.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.tools.broker import free_port
from stream_dedup.tools.generate import StreamSpec, write_jsonl

from .committed_reader import read_committed
from .support import (
    SLOW_COMMIT,
    Topics,
    assert_equal_to_offline_in_decision_order,
    events,
    kill_9_loop,
    process_config,
    produce,
    read_topic,
    scrape,
    start_script,
    write_toml,
)
from .test_process import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.soak]

DOCUMENTS = 1400
PARTITIONS = 3
KILLS = 5


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_kill_9_with_several_partitions_replays_identical_events(
    bootstrap: str, tmp_path: Path, delivery: str
) -> None:
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=PARTITIONS)
    stream = tmp_path / "stream.jsonl"
    with stream.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=DOCUMENTS, seed=29), fh)
    docs: list[dict[str, Any]] = [json.loads(line) for line in stream.read_text().splitlines()]

    def feed() -> None:  # ~60 documents/s, round-robin, so near-duplicates cross partitions
        for i in range(0, len(docs), 40):
            for p in range(PARTITIONS):
                chunk = docs[i + p : i + 40 : PARTITIONS]
                records = ((None, json.dumps(d).encode(), None) for d in chunk)
                produce(bootstrap, topics.input, records, partition=p)
            time.sleep(0.6)

    port = free_port()
    settings = process_config(bootstrap, topics, tmp_path / "index", port)
    # Small batches: the backlog that builds while a run restarts takes several batches,
    # so a kill soon after the first commit usually lands inside one (events out, not stored).
    settings["batch"] = {"max_messages": 100, "max_wait_ms": 50}
    settings["service"]["delivery"] = delivery
    config = write_toml(tmp_path / "stream-dedup.toml", settings)
    log = tmp_path / "service.log"
    script = tmp_path / "slow_commit.py"
    script.write_text(SLOW_COMMIT, encoding="utf-8")
    rng = random.Random(5)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    kills = kill_9_loop(lambda: start_script(script, config, log), port, KILLS, feeder, rng, 0.3)
    feeder.join(timeout=60)
    assert not feeder.is_alive()

    proc = start_script(script, config, log)
    try:
        wait_until(
            lambda: scrape(port, "stream_dedup_index_documents") == DOCUMENTS, 60, "all documents"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    if delivery == "exactly-once":  # what read_committed returns (see committed_reader)
        values = [v for t in (topics.unique, topics.duplicates) for _k, v in
                  read_committed(bootstrap, t).committed]  # fmt: skip
        out = [json.loads(v or b"null") for v in values]
        assert len(out) == DOCUMENTS  # exactly once
    else:
        msgs = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
        out = events(msgs)
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in out:
        by_id[ev["id"]].append(ev)
    assert set(by_id) == {d["id"] for d in docs}  # nothing lost
    assert {ev["partition"] for evs in by_id.values() for ev in evs} == set(range(PARTITIONS))
    for doc_id, evs in by_id.items():
        assert all(e == evs[0] for e in evs), (doc_id, evs)  # replays equal the first emission

    order = assert_equal_to_offline_in_decision_order(by_id, docs, tmp_path / "index", tmp_path)
    rank = {doc_id: i for i, doc_id in enumerate(order)}
    duplicates = 0
    for doc_id, evs in by_id.items():
        ev = evs[0]
        if ev["duplicate_of"] is not None:
            duplicates += 1
            assert rank[ev["duplicate_of"]] < rank[doc_id]  # named a document decided earlier
    assert duplicates > 0
    replays = log.read_text(encoding="utf-8").count("replaying the batch announced")
    assert replays >= 1, "no kill hit a batch between its intent and its commit"
    print(f"{delivery}: kills={kills} replayed_batches={replays} events={len(out)}")
