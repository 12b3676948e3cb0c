"""``kill -9`` at random moments while documents flow, in both delivery modes.

At-least-once: nothing is lost and a replayed batch is byte-identical to its first
emission. Exactly-once: a ``read_committed`` reader sees one event per document and one
dead letter per bad message, however often the service is killed (the reader applies the
log's transaction markers itself, :mod:`.committed_reader`, so that the check holds on a
broker that does not filter aborted transactions for its consumers). In both, the index
holds a window (``index.max_documents``), so epochs open and are dropped across the
kills, and verdicts must still equal the offline run's.
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
    kill_9_loop,
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

DOCUMENTS = 3000
#: Kills per delivery mode (each a restart and a group join, ~10 s on a busy host):
#: exactly-once has the most crash points to hit (inside a transaction, between its
#: commit and the index write); at-least-once is also killed by the revisions loop and,
#: in `make soak`, by the partition loop (5 per mode) and the shared-index loop (10).
KILLS = {"at-least-once": 3, "exactly-once": 5}
#: One message in this many is not JSON: it must reach the dead-letter topic.
BAD_EVERY = 100
#: The index holds the newest this many documents (retention): epochs open and are
#: dropped throughout the kills, and copies of stories older than that are unique.
MAX_DOCUMENTS = 400


def stream_messages(tmp_path: Path) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The documents (generated news with wire copies) and the messages, bad ones among them."""
    stream = tmp_path / "stream.jsonl"
    with stream.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=DOCUMENTS, seed=11), fh)
    docs = [json.loads(line) for line in stream.read_text().splitlines()]
    messages: list[bytes] = []
    for i, doc in enumerate(docs):
        if i % BAD_EVERY == BAD_EVERY - 1:
            messages.append(f'{{"id": "bad-{i}", "text": '.encode())  # cut off
        messages.append(json.dumps(doc).encode())
    return docs, messages


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_kill_9_loop(bootstrap: str, topics: Topics, tmp_path: Path, delivery: str) -> None:
    docs, messages = stream_messages(tmp_path)
    bad = [m for m in messages if m.startswith(b'{"id": "bad-')]
    reference = offline_reference(docs, tmp_path, "--max-documents", str(MAX_DOCUMENTS))

    # ~40 messages/s for 20 kills, faster for fewer: messages keep flowing across the kills
    pause = 0.25 * KILLS[delivery] / 20 + 0.025

    def feed() -> None:
        for i in range(0, len(messages), 10):
            produce(bootstrap, topics.input, ((None, m, None) for m in messages[i : i + 10]))
            time.sleep(pause)

    port = free_port()
    settings = process_config(bootstrap, topics, tmp_path / "index", port)
    settings["service"]["delivery"] = delivery
    settings["index"]["max_documents"] = MAX_DOCUMENTS
    config = write_toml(tmp_path / "stream-dedup.toml", settings)
    log = tmp_path / "service.log"
    script = tmp_path / "slow_commit.py"
    script.write_text(SLOW_COMMIT, encoding="utf-8")
    rng = random.Random(3)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    started = time.monotonic()
    kills = kill_9_loop(
        lambda: start_script(script, config, log), port, KILLS[delivery], feeder, rng, 0.4
    )
    killed_while_feeding = not feeder.is_alive()
    feeder.join(timeout=120)
    assert not feeder.is_alive()

    proc = start_script(script, config, log)
    try:
        wait_until(
            lambda: (
                scrape(port, "stream_dedup_messages_consumed_total") is not None
                and scrape(port, "stream_dedup_index_documents") == DOCUMENTS
            ),
            90,
            "all documents",
        )
        assert scrape(port, "stream_dedup_index_held_documents") == MAX_DOCUMENTS
        assert scrape(port, "stream_dedup_index_evicted_documents_total") == (
            DOCUMENTS - MAX_DOCUMENTS
        )
        assert (scrape(port, "stream_dedup_index_epochs") or 0) <= 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert kills == KILLS[delivery]
    print(f"{delivery}: {kills} kills in {time.monotonic() - started:.0f} s, "
          f"feeder done before the last: {killed_while_feeding}")  # fmt: skip

    if delivery == "exactly-once":
        seen = {t: read_committed(bootstrap, t) for t in (topics.unique, topics.duplicates)}
        out = [json.loads(v or b"null") for log_ in seen.values() for _k, v in log_.committed]
        dead = [v for _k, v in read_committed(bootstrap, topics.dlq).committed]
        aborted = sum(log_.aborted for log_ in seen.values())
        print(f"aborted transactions' events seen in the log and dropped: {aborted}")
    else:
        msgs = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
        out = [json.loads(m.value() or b"null") for m in msgs]
        dead = [m.value() for m in read_topic(bootstrap, topics.dlq, len(bad))]
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in out:
        by_id[ev["id"]].append(ev)
    assert set(by_id) == {d["id"] for d in docs}  # nothing lost
    for doc_id, evs in by_id.items():
        assert all(e == evs[0] for e in evs), doc_id  # replays identical to the first emission
        ref = reference[doc_id]
        for field in ("verdict", "duplicate_of", "similarity", "cluster_id"):
            assert evs[0][field] == ref[field], (doc_id, field)
    assert set(dead) == set(bad)
    if delivery == "exactly-once":
        assert len(out) == DOCUMENTS, [i for i, e in by_id.items() if len(e) > 1][:5]
        assert sorted(dead) == sorted(bad)  # dead letters exactly once
    else:
        assert len(out) >= DOCUMENTS
