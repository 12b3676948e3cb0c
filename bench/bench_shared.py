"""Throughput of the service on a shared Redis index, against RocksDB and datasketch.

Everything runs on this machine: the broker (an embedded Tansu, or the one at
``KAFKA_BOOTSTRAP_SERVERS``), Redis (a single node and a 3-master cluster started here from
``redis-server``), the service instances (``stream-dedup run`` subprocesses) and this
script. For each setup, ``-n`` news-like documents are produced to a fresh topic of
``--partitions`` partitions first; then the instances start in one consumer group, and
docs/s is measured from the first message consumed by any instance to the last batch
committed (the largest ``stream_dedup_last_commit_timestamp_seconds`` once the shared
``stream_dedup_index_documents`` reaches n).

Setups: one instance on RocksDB; one instance on Redis (single node, cluster); two
instances on Redis (single node, cluster), with the group's time order
(``index.redis.group_order``, the default: ``docs/group-order.md``) and without it.
``--setups`` picks some by name; setups run alternated, one run of each per round, so
that the machine's drift falls on all alike. Each instance also reports the share of its
run spent holding the index's lease (``stream_dedup_index_lease_held_seconds``): the part
that instances of a group do one at a time, from which the projection for more
instances and machines follows (see the README); and the CPU the instances used per
document (with their sketch workers) and how busy the machine's CPUs were meanwhile
(every process's): where the CPUs are all busy, more instances cannot be faster.

The peer is datasketch's ``MinHashLSH`` with its Redis storage, on the same single node:
a query then an insert per document (what deduplicating a stream needs), timed on the
first ``--peer-documents`` documents; the ratio printed is ours (one instance, single
node) over it.

    .venv/bin/python bench/bench_shared.py
    .venv/bin/python bench/bench_shared.py -n 30000 --repeats 3
    .venv/bin/python bench/bench_shared.py --setups "redis node" --delivery exactly-once
    .venv/bin/python bench/bench_shared.py -n 5000 --repeats 5 --setups "redis node"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_service import documents, produce_all
from bench_service import scrape as metrics
from cpu_time import host_cpu_s, redis_cpu_s, tree_cpu_s

from stream_dedup.tools import redis_local
from stream_dedup.tools.broker import (
    TANSU_CONSUMER_SETTINGS,
    EmbeddedBroker,
    create_topics,
    free_port,
)

#: (name, backend, Redis kind, instances, the group's time order)
SETUPS = [
    ("rocksdb, 1 instance", "rocksdb", None, 1, False),
    ("redis node, 1 instance", "redis", "node", 1, True),
    ("redis cluster, 1 instance", "redis", "cluster", 1, True),
    ("redis node, 2 instances", "redis", "node", 2, True),
    ("redis cluster, 2 instances", "redis", "cluster", 2, True),
    ("redis node, 1 instance, no group order", "redis", "node", 1, False),
    ("redis node, 2 instances, no group order", "redis", "node", 2, False),
    ("redis cluster, 2 instances, no group order", "redis", "cluster", 2, False),
]


def config_text(
    topic: str,
    bootstrap: str,
    port: int,
    args: argparse.Namespace,
    index: str,
    kafka: Mapping[str, str],
) -> str:
    delivery = f'[service]\ndelivery = "{args.delivery}"\n'
    return (
        delivery
        + f"""
[input]
topics = ["{topic}"]
{index}
[http]
host = "127.0.0.1"
port = {port}
check_port = 0
[batch]
max_messages = {args.max_messages}
max_wait_ms = {args.max_wait_ms}
[log]
level = "WARNING"
[kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "g-{topic}"
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "1000"
"partition.assignment.strategy" = "cooperative-sticky"
"""
        + "".join(f'"{k}" = "{v}"\n' for k, v in kafka.items())
    )


def one_run(
    bootstrap: str,
    workdir: Path,
    args: argparse.Namespace,
    backend: str,
    redis_url: str | None,
    instances: int,
    docs: list[dict[str, Any]],
    kafka: Mapping[str, str],
    order: bool = True,
) -> tuple[float, list[float], float | None, float, float, float]:
    """docs/s of one run, each instance's share of the run spent holding the lease, the
    Redis CPU per document (microseconds, all nodes together), the lease held per
    document (microseconds, all instances together: the service's own metric), the
    instances' CPU per document (microseconds, with their sketch workers) and the share
    of the machine's CPUs busy during the run (every process's, this script's and the
    broker's included)."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=args.partitions)
    create_topics(bootstrap, [f"{topic}.unique", f"{topic}.duplicates", f"{topic}.dlq"])
    if args.keyed:
        produce_keyed(bootstrap, topic, docs)
    else:
        produce_all(bootstrap, topic, docs)
    if backend == "redis":
        index = (
            f'[index]\nbackend = "redis"\n[index.redis]\nurl = "{redis_url}"\n'
            f'namespace = "{topic}"\ngroup_order = {str(order).lower()}\n'
        )
    else:
        index = f'[index]\npath = "{workdir / topic}"\n'
    ports = [free_port() for _ in range(instances)]
    procs: list[subprocess.Popen[bytes]] = []
    for n, port in enumerate(ports):
        path = workdir / f"{topic}-{n}.toml"
        own = dict(kafka)
        if args.delivery == "exactly-once":  # one transactional.id per instance
            own["transactional.id"] = f"{topic}-{n}"
        path.write_text(config_text(topic, bootstrap, port, args, index, own), encoding="utf-8")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "stream_dedup.cli", "run", "--config", str(path)],
                stdout=subprocess.DEVNULL,
            )
        )
    first: float | None = None
    cpu_start = redis_cpu_s(redis_url) if redis_url else None
    pids = [proc.pid for proc in procs]
    own_start, host_start = 0.0, (0.0, 0.0)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"an instance exited with code {proc.returncode}")
            seen = [metrics(p) for p in ports]
            if first is None and any(
                m.get("stream_dedup_messages_consumed_total", 0) > 0 for m in seen
            ):
                first = time.time()
                own_start, host_start = tree_cpu_s(pids), host_cpu_s()
            if first is not None and max(
                m.get("stream_dedup_index_documents", 0) for m in seen
            ) >= len(docs):
                end = max(m.get("stream_dedup_last_commit_timestamp_seconds", 0) for m in seen)
                held = [
                    m.get("stream_dedup_index_lease_held_seconds_sum", 0.0) / (end - first)
                    for m in seen
                ]
                cpu = None
                if redis_url and cpu_start is not None:
                    cpu = (redis_cpu_s(redis_url) - cpu_start) / len(docs) * 1e6
                lease = sum(m.get("stream_dedup_index_lease_held_seconds_sum", 0.0) for m in seen)
                own = (tree_cpu_s(pids) - own_start) / len(docs) * 1e6
                busy, every = (b - a for a, b in zip(host_start, host_cpu_s(), strict=True))
                rate = len(docs) / (end - first)
                return rate, held, cpu, lease / len(docs) * 1e6, own, busy / max(every, 1e-9)
            time.sleep(0.01 if first is None else 0.5)
        raise RuntimeError("the run did not finish")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)


def produce_keyed(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    """Each document keyed by its id, so consecutive documents spread over the partitions
    (the finest interleaving of times: the group order's worst case)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    for d in docs:
        while True:
            try:
                producer.produce(topic, json.dumps(d).encode(), key=d["id"].encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)


def datasketch_rate(docs: list[dict[str, Any]], redis_url: str) -> float:
    """datasketch MinHashLSH on Redis: query then insert, per document."""
    from urllib.parse import urlsplit

    from datasketch import MinHash, MinHashLSH

    parts = urlsplit(redis_url)
    lsh = MinHashLSH(
        threshold=0.8,
        num_perm=128,
        storage_config={
            "type": "redis",
            "basename": uuid.uuid4().hex[:8].encode(),
            "redis": {"host": parts.hostname, "port": parts.port},
        },
    )
    started = time.perf_counter()
    for d in docs:
        text = " ".join(d["text"].lower().split())
        m = MinHash(num_perm=128)
        m.update_batch([text[i : i + 5].encode() for i in range(max(1, len(text) - 4))])
        lsh.query(m)
        lsh.insert(d["id"], m)
    return len(docs) / (time.perf_counter() - started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--partitions", type=int, default=4, help="input topic partitions (4)")
    p.add_argument("--max-messages", type=int, default=2000, help="batch.max_messages")
    p.add_argument("--max-wait-ms", type=int, default=20, help="batch.max_wait_ms")
    p.add_argument("--peer-documents", type=int, default=1000, help="datasketch's documents")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument(
        "--delivery",
        choices=("at-least-once", "exactly-once"),
        default="at-least-once",
        help="service.delivery of every setup (at-least-once)",
    )
    p.add_argument("--setups", default="", help="run only setups whose name has this text")
    p.add_argument("--no-peer", action="store_true", help="skip datasketch")
    p.add_argument(
        "--keyed", action="store_true", help="key documents by id (else sticky partitioning)"
    )
    args = p.parse_args()
    setups = [s for s in SETUPS if args.setups in s[0]]

    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "documents": args.documents,
        "partitions": args.partitions,
    }
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-shared-") as tmp:
        work = Path(tmp)
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        kafka: dict[str, str] = {}
        if not bootstrap:
            broker = EmbeddedBroker()
            broker.start()
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
            kafka = dict(TANSU_CONSUMER_SETTINGS)
        urls = {
            "node": stack.enter_context(redis_local.single_node(work / "node")),
            "cluster": stack.enter_context(redis_local.cluster(work / "cluster")),
        }
        print(f"{os.cpu_count()} CPUs; {args.documents:,} documents, {args.partitions} partitions")
        medians = run_setups(setups, args, bootstrap, work, urls, kafka, results)
        if args.no_peer or "redis node, 1 instance" not in medians:
            return finish(args, results)
        peer_docs = documents(args.peer_documents, 0)
        peer = [datasketch_rate(peer_docs, urls["node"]) for _ in range(args.repeats)]
        results["datasketch_redis_docs_per_s"] = peer
        ours = medians["redis node, 1 instance"]
        print(
            "datasketch MinHashLSH on Redis (query + insert): median "
            f"{statistics.median(peer):,.0f} "
            f"docs/s over {args.peer_documents:,} documents; ours / datasketch = "
            f"{ours / statistics.median(peer):.1f}x"
        )
        base = medians.get("rocksdb, 1 instance")
        for name in medians:
            if base:
                print(f"  {name}: {medians[name] / base:.2f}x of one instance on RocksDB")
    return finish(args, results)


def run_setups(
    setups: list[tuple[str, str, str | None, int, bool]],
    args: argparse.Namespace,
    bootstrap: str,
    work: Path,
    urls: Mapping[str, str],
    kafka: Mapping[str, str],
    results: dict[str, Any],
) -> dict[str, float]:
    """Each setup ``--repeats`` times, alternated (round r runs every setup once, on the
    same documents); returns the median docs/s per setup."""
    runs: dict[str, dict[str, list[Any]]] = {
        s[0]: {
            "docs_per_s": [],
            "lease_held_share": [],
            "redis_cpu_us": [],
            "lease_us_per_doc": [],
            "instance_cpu_us": [],
            "host_busy_share": [],
        }
        for s in setups
    }
    for r in range(args.repeats):
        docs = documents(args.documents, r)
        for name, backend, kind, instances, order in setups:
            url = urls[kind] if kind else None
            measured = one_run(bootstrap, work, args, backend, url, instances, docs, kafka, order)
            rate, held, cpu, lease_us, own_cpu, busy = measured
            for key, value in zip(runs[name], measured, strict=True):
                runs[name][key].append(value)
            lease = (
                ""
                if backend != "redis"
                else "; lease held "
                + " / ".join(f"{100 * h:.0f}%" for h in held)
                + f", {lease_us:.1f} us/doc"
            )
            redis_cpu = "" if cpu is None else f"; Redis CPU {cpu:.0f} us/doc"
            print(
                f"  {name} run {r + 1}: {rate:,.0f} docs/s{lease}{redis_cpu}; instances' CPU "
                f"{own_cpu:.0f} us/doc; CPUs busy {100 * busy:.0f}%",
                flush=True,
            )
    medians: dict[str, float] = {}
    for name, run in runs.items():
        medians[name] = statistics.median(run["docs_per_s"])
        results[name] = run
        known = [c for c in run["redis_cpu_us"] if c is not None]
        per_doc = ""
        if known:
            lease_med, cpu_med = (
                statistics.median(run["lease_us_per_doc"]),
                statistics.median(known),
            )
            per_doc = (
                f", lease {lease_med:.1f} us/doc, Redis CPU {cpu_med:.0f} us/doc; "
                f"projection: {1e6 / lease_med:,.0f} docs/s per index (the lease), "
                f"{1e6 / cpu_med:,.0f} docs/s per Redis core"
            )
        print(f"{name}: median {medians[name]:,.0f} docs/s{per_doc}")
    return medians


def finish(args: argparse.Namespace, results: dict[str, Any]) -> int:
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
