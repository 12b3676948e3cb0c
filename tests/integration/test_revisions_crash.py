"""Revisions through Kafka with ``kill -9``: each decided once, replays identical.

A stream of ids seen again with other texts (new articles, near-identical edits), with
the same texts again (replays of revision 1 and of revision 2 after it), and with later
exact copies of revised texts under new ids, flows while the service is killed. One input
partition, so the service decides in message order and the offline command over the same
documents is the reference, line by line: every revision is decided once (the index
counts each (id, text) once), every emission of a message is byte for byte the first,
and a copy of a revised text is a duplicate of the id it was revised under. At-least-once
runs on Redis (the shared index), exactly-once on RocksDB (and on Redis under ``make
soak``).
"""

from __future__ import annotations

import json
import random
import signal
import string
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.cli.app import main as cli_main
from stream_dedup.core.lookup_keys import content_digest, exact_key
from stream_dedup.core.normalize import normalize
from stream_dedup.index.records import text_of
from stream_dedup.tools.broker import free_port

from .committed_reader import read_committed
from .support import (
    SLOW_COMMIT,
    Topics,
    kill_9_loop,
    process_config,
    produce,
    read_topic,
    scrape,
    start_script,
    write_toml,
)
from .test_process import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

IDS = 120
#: Kills per delivery mode (each costs a restart and a group join, ~6 s on Tansu):
#: exactly-once has the more crash points (inside a transaction, between its commit and
#: the index write).
KILLS = {"exactly-once": 3, "at-least-once": 2}


def article(seed: int, words: int = 80) -> str:
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(words)
    )


def edited(text: str) -> str:
    """A near-identical edit: one word of 80 replaced."""
    words = text.split()
    words[len(words) // 2] = "corrected"
    return " ".join(words)


def text_tag(text: str) -> str:
    return text_of(exact_key(content_digest(normalize(text).encode())))


def revision_stream() -> list[dict[str, str]]:
    """First texts, then per id: a new text, an edit or the same text again; then copies
    of the new texts, replays of both revisions and some third texts."""
    docs = [{"id": f"u{i}", "text": article(i)} for i in range(IDS)]
    for i in range(IDS):
        kind = i % 3
        text = article(1000 + i) if kind == 0 else edited(article(i)) if kind == 1 else article(i)
        docs.append({"id": f"u{i}", "text": text})
    for i in range(0, IDS, 3):
        docs.append({"id": f"copy-u{i}", "text": article(1000 + i)})
        docs.append({"id": f"u{i}", "text": article(i).upper()})  # revision 1 again
        docs.append({"id": f"u{i}", "text": article(1000 + i)})  # revision 2 again
        if i % 2 == 0:
            docs.append({"id": f"u{i}", "text": article(2000 + i)})  # revision 3
    return docs


def offline_lines(docs: list[dict[str, str]], tmp_path: Path) -> list[dict[str, Any]]:
    """The offline command's line for each document, in order."""
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    out = tmp_path / "verdicts.jsonl"
    assert cli_main(["dedup", str(source), "-o", str(out), "-q"]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(
    ("delivery", "backend"),
    [
        ("exactly-once", "rocksdb"),
        ("at-least-once", "redis"),
        # the shared index's exactly-once: its two-instance kill loop runs in `make test`
        pytest.param("exactly-once", "redis", marks=pytest.mark.soak),
    ],
)
def test_revisions_survive_kill_9(
    bootstrap: str, topics: Topics, tmp_path: Path, redis_url: str, delivery: str, backend: str
) -> None:
    docs = revision_stream()
    reference = offline_lines(docs, tmp_path)
    decided = [r for r in reference if not r.get("replayed")]
    revised = [r for r in decided if r.get("revision", 1) > 1]
    third = len(range(0, IDS, 6))
    assert len(revised) == 2 * IDS // 3 + third  # new texts and edits, then third texts
    messages = [json.dumps(d).encode() for d in docs]

    def feed() -> None:
        for i in range(0, len(messages), 10):
            produce(bootstrap, topics.input, ((None, m, None) for m in messages[i : i + 10]))
            time.sleep(0.05)

    port = free_port()
    settings = process_config(bootstrap, topics, tmp_path / "index", port)
    settings["service"]["delivery"] = delivery
    settings["batch"]["max_messages"] = 40  # batches holding two revisions of an id
    if backend == "redis":
        settings["index"] = {
            "backend": "redis",
            # a lease held by a killed instance is taken over after 2 s, not 10
            "redis": {"url": redis_url, "namespace": uuid.uuid4().hex[:8], "lock_ttl_ms": 2000},
        }
        if delivery == "exactly-once":  # the instance's own id, kept across its restarts
            settings["kafka"]["transactional.id"] = f"{topics.group}-one"
    config = write_toml(tmp_path / "stream-dedup.toml", settings)
    log = tmp_path / "service.log"
    script = tmp_path / "slow_commit.py"
    script.write_text(SLOW_COMMIT, encoding="utf-8")
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    kills = kill_9_loop(
        lambda: start_script(script, config, log),
        port,
        KILLS[delivery],
        feeder,
        random.Random(5),
        0.3,
    )
    feeder.join(timeout=60)
    assert not feeder.is_alive()
    proc = start_script(script, config, log)
    try:
        # every (id, text) decided once: the index counts each revision once
        wait_until(lambda: scrape(port, "stream_dedup_index_documents") == len(decided), 60, "all")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert kills == KILLS[delivery]

    if delivery == "exactly-once":
        logs = [read_committed(bootstrap, t) for t in (topics.unique, topics.duplicates)]
        raw = [v or b"" for log_ in logs for _k, v in log_.committed]
    else:
        msgs = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
        raw = [m.value() or b"" for m in msgs]
    by_offset: dict[int, list[bytes]] = defaultdict(list)
    for value in raw:
        by_offset[json.loads(value)["offset"]].append(value)
    assert sorted(by_offset) == list(range(len(docs)))  # nothing lost
    if delivery == "exactly-once":
        assert len(raw) == len(docs)
    fields = ("id", "verdict", "duplicate_of", "similarity", "cluster_id", "revision", "previous")
    for offset, values in by_offset.items():
        assert all(v == values[0] for v in values), offset  # re-emissions byte-identical
        event, line = json.loads(values[0]), reference[offset]
        assert {f: event.get(f) for f in fields} == {f: line.get(f) for f in fields}, offset

    # spelled out: what the reference says, for each kind of repeat
    events = [{f: json.loads(by_offset[o][0]).get(f) for f in fields} for o in range(len(docs))]
    last = {(d["id"], d["text"]): n for n, d in enumerate(docs)}  # the last position
    for i in range(IDS):
        first, second = events[i], events[IDS + i]
        if i % 3 == 2:  # the same text again: revision 1's event, replayed
            assert second == first
            continue
        assert (second["revision"], second["previous"]) == (2, text_tag(article(i)))
        assert first["revision"] is None  # revision 1 carries no field
        if i % 3 == 1:  # an edit matches the id's own first text
            assert (second["verdict"], second["duplicate_of"]) == ("duplicate", f"u{i}")
            continue
        copy = events[last[(f"copy-u{i}", article(1000 + i))]]
        assert (copy["verdict"], copy["duplicate_of"], copy["similarity"]) == (
            "duplicate",
            f"u{i}",
            1.0,
        )
        assert events[last[(f"u{i}", article(1000 + i))]] == second  # revision 2 replayed
        assert events[last[(f"u{i}", article(i).upper())]] == first  # revision 1 replayed
