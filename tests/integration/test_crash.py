"""``kill -9`` at random moments while documents flow: nothing lost, nothing decided twice."""

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

from .support import (
    Topics,
    events,
    kill_9_loop,
    offline_reference,
    process_config,
    produce,
    read_topic,
    scrape,
    write_toml,
)
from .test_process import start, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DOCUMENTS = 3000
KILLS = 6


def test_kill_9_loop_loses_nothing_and_replays_identically(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    stream = tmp_path / "stream.jsonl"
    with stream.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=DOCUMENTS, seed=11), fh)
    docs: list[dict[str, Any]] = [json.loads(line) for line in stream.read_text().splitlines()]
    reference = offline_reference(docs, tmp_path)

    def feed() -> None:  # ~150 documents/s, so documents keep flowing across the kills
        for i in range(0, len(docs), 30):
            chunk = docs[i : i + 30]
            produce(bootstrap, topics.input, ((None, json.dumps(d).encode(), None) for d in chunk))
            time.sleep(0.2)

    port = free_port()
    config = write_toml(
        tmp_path / "stream-dedup.toml",
        process_config(bootstrap, topics, tmp_path / "index", port),
    )
    log = tmp_path / "service.log"
    rng = random.Random(3)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    kills = kill_9_loop(lambda: start(config, log), port, KILLS, feeder, rng, 0.4)
    feeder.join(timeout=60)
    assert not feeder.is_alive()

    proc = start(config, log)
    try:
        wait_until(
            lambda: scrape(port, "stream_dedup_index_documents") == DOCUMENTS, 90, "all documents"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert kills >= 5

    out = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events(out):
        by_id[ev["id"]].append(ev)
    assert set(by_id) == {d["id"] for d in docs}  # nothing lost
    for doc_id, evs in by_id.items():
        assert all(e == evs[0] for e in evs), doc_id  # replays identical to the first emission
        ref = reference[doc_id]
        for field in ("verdict", "duplicate_of", "similarity", "cluster_id"):
            assert evs[0][field] == ref[field], (doc_id, field)
    assert len(out) >= DOCUMENTS
