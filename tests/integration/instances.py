"""Several service instances of one group on one shared index, killed with -9 in turn.

The pieces the shared-index kill tests have in common: a stream of documents with
malformed messages among them, fed slowly enough that kills land while it flows; the
instances' settings; the kill loop; and the order in which the instances decided the
documents, read back from the index.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stream_dedup.index import DedupIndex
from stream_dedup.index.records import decode_doc
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.tools.generate import StreamSpec, write_jsonl

from .support import Topics, process_config, produce, scrape, write_toml
from .test_process import wait_until


def mixed_stream(
    path: Path, documents: int, bad_every: int, seed: int = 23
) -> tuple[list[dict[str, Any]], list[bytes], set[bytes]]:
    """Generated documents, the messages carrying them with a malformed one every
    ``bad_every``, and the malformed ones."""
    with path.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=documents, seed=seed), fh)
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    messages: list[bytes] = []
    for i, doc in enumerate(docs):
        if i % bad_every == bad_every - 1:
            messages.append(f'{{"id": "bad-{i}", "text": '.encode())
        messages.append(json.dumps(doc).encode())
    bad = {m for m in messages if m.startswith(b'{"id": "bad-')}
    return docs, messages, bad


def slow_feeder(
    bootstrap: str, topic: str, messages: list[bytes], pause_s: float = 0.3
) -> threading.Thread:
    """A thread producing 10 messages every ``pause_s``, keyed over the partitions (copies
    cross instances)."""

    def feed() -> None:
        for i in range(0, len(messages), 10):
            chunk = enumerate(messages[i : i + 10], start=i)
            produce(bootstrap, topic, ((str(n).encode(), m, None) for n, m in chunk))
            time.sleep(pause_s)

    return threading.Thread(target=feed, daemon=True)


def instance_configs(
    bootstrap: str,
    topics: Topics,
    redis: dict[str, Any],
    ports: list[int],
    tmp_path: Path,
    kafka: Callable[[int], dict[str, str]] = lambda _n: {},
    service: dict[str, Any] | None = None,
) -> list[Path]:
    """One settings file per instance: the shared index ``redis`` (``[index.redis]``),
    cooperative rebalancing, the instance's own ``kafka(n)`` keys."""
    configs = []
    for n, port in enumerate(ports):
        settings = process_config(bootstrap, topics, tmp_path / f"unused-{n}", port)
        settings["index"] = {"backend": "redis", "redis": redis}
        settings["kafka"]["partition.assignment.strategy"] = "cooperative-sticky"
        settings["kafka"].update(kafka(n))
        settings["service"].update(service or {})
        configs.append(write_toml(tmp_path / f"instance-{n}.toml", settings))
    return configs


def up(port: int) -> bool:
    return scrape(port, "stream_dedup_index_documents") is not None


def kill_in_turn(
    procs: list[subprocess.Popen[bytes]],
    ports: list[int],
    start: Callable[[int], subprocess.Popen[bytes]],
    kills: int,
    feeder: threading.Thread,
    rng: random.Random,
    progress: str = "stream_dedup_commits_total",
    jitter_s: float = 0.4,
    aim: Callable[[int], bool] | None = None,
) -> int:
    """``kill -9`` the instances in turn, each once its ``progress`` counter grew since the
    last look, at a random moment within ``jitter_s``, and start it again; returns the
    kills done.

    In turn, so that each kill lands while the other instance runs: its partitions move
    there (after the group's session timeout) or come back to it once restarted. With
    ``progress`` the messages consumed (counted as a batch starts), a kill lands inside
    that batch's commit: before its store, in its open transaction, or just after it.
    With ``aim``, every third kill (the first included) waits instead until ``aim(n)``
    holds and lands at once, so the moment it tests does not depend on the machine's pace.
    """
    kills_done = 0
    while kills_done < kills:
        n = kills_done % len(procs)
        before = scrape(ports[n], progress) or 0.0
        deadline = time.monotonic() + 40
        while (scrape(ports[n], progress) or 0.0) <= before:
            if not feeder.is_alive():
                break
            assert time.monotonic() < deadline, f"instance {n} made no progress"
            time.sleep(0.01)
        if aim is not None and kills_done % 3 == 0:
            while not aim(n):
                assert time.monotonic() < deadline + 40, f"instance {n} never reached its aim"
                time.sleep(0.002)
        else:
            time.sleep(rng.uniform(0.0, jitter_s))
        procs[n].send_signal(signal.SIGKILL)
        procs[n].wait(timeout=10)
        kills_done += 1
        procs[n] = start(n)
        wait_until(lambda p=ports[n]: up(p), 60, "the instance back")
    return kills_done


def stop_all(
    procs: list[subprocess.Popen[bytes]], ports: list[int], timeout_s: float = 40
) -> list[int]:
    """SIGTERM every instance once each has partitions, then their exit codes.

    Waiting for partitions first: an instance restarted by the last kill may still be
    loading its kernels on a busy machine, and a stop then waits for that to end.
    """
    for port in ports:
        wait_until(
            lambda p=port: (scrape(p, "stream_dedup_assigned_partitions") or 0) >= 1,
            60,
            "every instance with partitions",
        )
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    return [proc.wait(timeout=timeout_s) for proc in procs]


def kill_leftovers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def shared_order(url: str, namespace: str) -> list[str]:
    """Ids in the order the instances decided them: the shared index numbers documents so."""
    index = DedupIndex(RedisBackend(url, namespace=namespace), None)
    try:
        n = index.counter("indexed")
        raw = index.read_documents(list(range(n)))
    finally:
        index.close()
    return [decode_doc(r).doc_id for r in raw if r is not None]
