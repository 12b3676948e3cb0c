"""Where a group of instances on one shared index spends a run: per instance, per process.

``bench_shared.py`` gives a setup's docs/s; this traces one run of it, to find where two
instances lose to one. Per instance, from its own metrics at the end of the run: the time
spent waiting for the group's low watermark
(``stream_dedup_group_order_wait_seconds_total``), waiting for and holding the index's
lease, in committing (delivery: produce, broker acknowledgements, offsets), its batches
(how many: each a turn of the lease; their mean size), the documents it sketched in
its own process rather than its sketch worker's, its looks at the other members' ends
(``end looks``: all at their end; ``behind``: records there not taken yet, so it waited),
and its CPU seconds (with its sketch worker); for the run, the CPU seconds of Redis and
of the broker, each per document, and how busy the machine's CPUs were. Setups (one,
two and three instances with the group's order, one and two without; ``--setups`` picks
by name) run alternated, round by round.

``--warm N`` measures a group already running instead of one starting on a backlog: the
instances start on an empty topic, ``N`` warm-up documents (ids of their own) are
produced and decided (every instance has its partitions, its compiled kernels loaded,
its key filters built), and only then is the backlog produced. Without it (as in
``bench_shared.py``) the run is timed from the first batch any instance decides, while
the others may still be starting and the group still rebalancing: on a backlog of a few
seconds, that start-up, on the same CPUs, is part of what is measured.

    .venv/bin/python bench/trace_shared.py -n 12000 --rounds 2
    .venv/bin/python bench/trace_shared.py -n 12000 --setups "2 instances, order on"
    .venv/bin/python bench/trace_shared.py -n 12000 --rounds 3 --warm 400
    .venv/bin/python bench/trace_shared.py -n 12000 --warm 400 --keyed --setups "order on"
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench_shared import config_text
from cpu_time import host_cpu_s, redis_cpu_s, tree_cpu_s
from service_run import documents, produce_all, scrape

from stream_dedup.tools import redis_local
from stream_dedup.tools.broker import (
    TANSU_CONSUMER_SETTINGS,
    EmbeddedBroker,
    create_topics,
    free_port,
)

#: (name, instances, the group's time order)
SETUPS = [
    ("1 instance, order on", 1, True),
    ("2 instances, order on", 2, True),
    ("3 instances, order on", 3, True),
    ("1 instance, order off", 1, False),
    ("2 instances, order off", 2, False),
]

#: The per-instance figures read from each instance's metrics at the end of a run.
_SUMS = {
    "order wait s": "stream_dedup_group_order_wait_seconds_total",
    "lease wait s": "stream_dedup_index_lease_wait_seconds_sum",
    "lease held s": "stream_dedup_index_lease_held_seconds_sum",
    "commit s": "stream_dedup_commit_duration_seconds_sum",
    "batch s": "stream_dedup_batch_duration_seconds_sum",
    "batches": "stream_dedup_batch_size_messages_count",
    "docs": "stream_dedup_batch_size_messages_sum",
    "ahead used": 'stream_dedup_group_decided_ahead_batches_total{outcome="used"}',
    "ahead dropped": 'stream_dedup_group_decided_ahead_batches_total{outcome="dropped"}',
    "redecided": "stream_dedup_redecided_documents_total",
    "sketched here": 'stream_dedup_sketched_documents_total{by="service"}',
    "end looks": 'stream_dedup_group_end_looks_total{outcome="at_end"}',
    "behind": 'stream_dedup_group_end_looks_total{outcome="behind"}',
}


def trace_run(
    bootstrap: str,
    broker_pid: int | None,
    work: Path,
    args: argparse.Namespace,
    url: str,
    instances: int,
    order: bool,
    docs: list[dict[str, Any]],
    kafka: dict[str, str],
    ahead: bool = True,
) -> dict[str, Any]:
    """One run: docs/s, each instance's figures, and every process's CPU per document."""
    topic = f"trace-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], partitions=args.partitions)
    create_topics(bootstrap, [f"{topic}.unique", f"{topic}.duplicates", f"{topic}.dlq"])
    warm = warm_documents(args.warm)
    if not warm:
        produce_all(bootstrap, topic, docs, args.keyed)
    index = (
        f'[index]\nbackend = "redis"\n[index.redis]\nurl = "{url}"\n'
        f'namespace = "{topic}"\ngroup_order = {str(order).lower()}\n'
        f"order_tick_ms = {args.tick_ms}\ndecide_ahead = {str(ahead).lower()}\n"
    )
    ports = [free_port() for _ in range(instances)]
    procs = []
    for n, port in enumerate(ports):
        path = work / f"{topic}-{n}.toml"
        path.write_text(config_text(topic, bootstrap, port, args, index, kafka), encoding="utf-8")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "stream_dedup.cli", "run", "--config", str(path)],
                stdout=subprocess.DEVNULL,
            )
        )
    pids = [p.pid for p in procs]
    try:
        if warm:
            warm_up(bootstrap, topic, ports, warm, instances)
        first: float | None = None
        start: dict[str, Any] = {}
        produced = 0.0
        if warm:
            if args.rate:
                # live: timed from the first record produced; the lag is how long after
                # the last one was produced the group had decided it
                first = time.time()
                start = counters(pids, broker_pid, url)
            produce_all(bootstrap, topic, docs, args.keyed, args.rate)
            produced = time.time()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            seen = [scrape(p) for p in ports]
            if first is None and sum(
                m.get("stream_dedup_messages_consumed_total", 0) for m in seen
            ) > len(warm):
                first = time.time()
                start = counters(pids, broker_pid, url)
            if first is not None and max(
                m.get("stream_dedup_index_documents", 0) for m in seen
            ) >= len(docs) + len(warm):
                end = max(m.get("stream_dedup_last_commit_timestamp_seconds", 0) for m in seen)
                n = len(docs)
                busy, every = (b - a for a, b in zip(start["host"], host_cpu_s(), strict=True))
                own = [tree_cpu_s([pid]) - s for pid, s in zip(pids, start["own"], strict=True)]
                return {
                    "docs_per_s": n / (end - first),
                    "seconds": end - first,
                    "lag_s": end - produced if args.rate else None,
                    "instances": [
                        {k: m.get(v, 0.0) for k, v in _SUMS.items()} | {"cpu s": c}
                        for m, c in zip(seen, own, strict=True)
                    ],
                    "cpu_us_per_doc": {
                        "instances": sum(own) / n * 1e6,
                        "redis": (redis_cpu_s(url) - start["redis"]) / n * 1e6,
                        "broker": (
                            (tree_cpu_s([broker_pid]) - start["broker"]) / n * 1e6
                            if broker_pid
                            else 0.0
                        ),
                    },
                    "host_busy": busy / max(every, 1e-9),
                    "load": (start["load"], os.getloadavg()[0]),
                }
            time.sleep(0.01 if first is None else 0.2)
        raise RuntimeError("the run did not finish")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)


def counters(pids: list[int], broker_pid: int | None, url: str) -> dict[str, Any]:
    """The CPU counters a run is measured from: the instances', the broker's, Redis's,
    the host's, and the load average."""
    return {
        "own": [tree_cpu_s([pid]) for pid in pids],
        "broker": tree_cpu_s([broker_pid]) if broker_pid else 0.0,
        "redis": redis_cpu_s(url),
        "host": host_cpu_s(),
        "load": os.getloadavg()[0],
    }


def warm_documents(n: int) -> list[dict[str, Any]]:
    """``n`` documents unlike the measured ones, with ids of their own."""
    docs = documents(n, 10_000) if n else []
    for d in docs:
        d["id"] = f"warm-{d['id']}"
    return docs


def warm_up(
    bootstrap: str, topic: str, ports: list[int], warm: list[dict[str, Any]], instances: int
) -> None:
    """Wait until every instance holds partitions, then until the warm-up documents are
    decided (the figures read from the instances at the end include these few)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        seen = [scrape(p) for p in ports]
        if sum(1 for m in seen if m.get("stream_dedup_assigned_partitions", 0) > 0) == instances:
            break
        time.sleep(0.1)
    time.sleep(2.0)  # a cooperative rebalance may still move partitions
    produce_all(bootstrap, topic, warm)
    while time.monotonic() < deadline:
        seen = [scrape(p) for p in ports]
        if max(m.get("stream_dedup_index_documents", 0) for m in seen) >= len(warm):
            time.sleep(1.0)  # their deliveries and the after-lease work settle
            return
        time.sleep(0.1)
    raise RuntimeError("the warm-up did not finish")


def show(name: str, r: int, run: dict[str, Any]) -> None:
    cpu = run["cpu_us_per_doc"]
    print(
        f"{name} round {r}: {run['docs_per_s']:,.0f} docs/s in {run['seconds']:.2f} s; CPU "
        f"us/doc instances {cpu['instances']:.0f}, Redis {cpu['redis']:.0f}, broker "
        f"{cpu['broker']:.0f}; CPUs busy {100 * run['host_busy']:.0f}%; load "
        f"{run['load'][0]:.1f}-{run['load'][1]:.1f}"
        + (f"; lag at the end {run['lag_s']:.2f} s" if run["lag_s"] is not None else ""),
        flush=True,
    )
    for i, inst in enumerate(run["instances"]):
        size = inst["docs"] / max(inst["batches"], 1)
        parts = ", ".join(
            f"{k} {inst[k]:.2f}" if k.endswith(" s") else f"{k} {inst[k]:.0f}"
            for k in _SUMS
            if k not in ("batches", "docs")
        )
        print(
            f"    instance {i}: {inst['batches']:.0f} batches of {size:.0f}; {parts}; "
            f"cpu s {inst['cpu s']:.2f}",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=12_000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--max-messages", type=int, default=2000)
    p.add_argument("--max-wait-ms", type=int, default=20)
    p.add_argument("--cluster", action="store_true", help="a 3-master cluster, not one node")
    p.add_argument("--setups", default="", help="only setups whose name has this text")
    p.add_argument("--warm", type=int, default=0, help="warm-up documents (module docstring)")
    p.add_argument(
        "--tick-ms", type=int, default=100, help="index.redis.order_tick_ms (default 100)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="with --warm: produce at this many docs/s (live) and report the lag at the end",
    )
    p.add_argument(
        "--keyed",
        action="store_true",
        help="produce each document keyed by its id (records interleave over partitions)",
    )
    p.add_argument(
        "--decide-ahead",
        choices=("on", "off", "both"),
        default="on",
        help="index.redis.decide_ahead; both: off then on, each setup, each round",
    )
    args = p.parse_args()
    aheads = {"on": [True], "off": [False], "both": [False, True]}[args.decide_ahead]
    args.delivery = "at-least-once"
    setups = [s for s in SETUPS if args.setups in s[0]]
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="trace-shared-") as tmp:
        work = Path(tmp)
        broker = EmbeddedBroker()
        broker.start()
        stack.callback(broker.stop)
        kind = redis_local.cluster if args.cluster else redis_local.single_node
        url = stack.enter_context(kind(work / "redis"))
        for r in range(args.rounds):
            docs = documents(args.documents, r)
            for (name, instances, order), ahead in itertools.product(setups, aheads):
                run = trace_run(
                    broker.bootstrap,
                    broker.pid,
                    work,
                    args,
                    url,
                    instances,
                    order,
                    docs,
                    dict(TANSU_CONSUMER_SETTINGS),
                    ahead,
                )
                label = name if len(aheads) == 1 else f"{name}, ahead {'on' if ahead else 'off'}"
                show(label, r + 1, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
