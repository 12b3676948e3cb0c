"""How many serial steps a group needs to decide a backlog in time order, by rule.

Under the group's time order (``docs/group-order.md``) instances of one group take
turns: one decides while the others wait, and each turn costs a release, a lease, a store
and a wake-up however few records it holds. This counts the turns a backlog needs, from
the records' order alone (no broker, no Redis), for two rules the service has and one it
has not:

* **exact**: the order by (time, partition, offset); a turn ends wherever the next record
  belongs to another instance (``order_tick_ms = 1``);
* **tick**: the same by (time cut to the tick, instance, partition, offset) (the
  default, 100 ms);
* **conflict** (not built; a projection): an instance waits only for the other instances'
  earlier records that share a look-up key (an LSH band key or the exact-text key) with
  one of its own, the only records its verdicts can depend on. Every instance releases,
  round by round, the longest run of its records none of which depends on a record not
  yet decided; rounds run side by side, so a round is one serial step whatever the number
  of instances. It assumes every instance has its backlog fetched and sketched, and sees
  the others' keys (published beside their heads): an upper bound on what the rule gives.

A wire stream from the generator (copies of a story within ~150 records), keyed over
``--partitions`` partitions by a CRC32 of the id, records ``--spacing-ms`` apart, the
partitions split among ``--instances`` instances in ranges (Kafka's range assignor) or
round robin.

    PYTHONPATH=. .venv/bin/python bench/order_rounds.py -n 12000
    PYTHONPATH=. .venv/bin/python bench/order_rounds.py -n 12000 --instances 3 --partitions 12
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections import defaultdict

import mmh3

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.sketch import sketch
from stream_dedup.tools.generate import StreamSpec, generate


def turns(owner_in_order: list[int]) -> int:
    """Runs of one owner along an order: the turns the group takes."""
    return sum(1 for i, o in enumerate(owner_in_order) if i == 0 or o != owner_in_order[i - 1])


def conflict_rounds(keys: list[set[bytes]], owner: list[int], instances: int) -> int:
    """Rounds of the conflict rule over records in their exact order (module docstring)."""
    n = len(keys)
    deps: list[list[int]] = [[] for _ in range(n)]  # earlier records of other instances
    holders: dict[bytes, list[int]] = defaultdict(list)
    for i in range(n):
        seen: set[int] = set()
        for key in keys[i]:
            for j in holders[key]:
                if owner[j] != owner[i] and j not in seen:
                    seen.add(j)
                    deps[i].append(j)
            holders[key].append(i)
    queues = [[i for i in range(n) if owner[i] == m] for m in range(instances)]
    at = [0] * instances
    decided = [False] * n
    rounds = 0
    while any(at[m] < len(queues[m]) for m in range(instances)):
        rounds += 1
        now: list[int] = []
        for m in range(instances):
            q = queues[m]
            while at[m] < len(q) and all(decided[j] for j in deps[q[at[m]]]):
                now.append(q[at[m]])
                at[m] += 1
        if not now:
            raise RuntimeError("no instance can go on: a dependency cycle")
        for i in now:
            decided[i] = True
    return rounds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=12_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--spacing-ms", type=float, default=0.5, help="ms between records")
    p.add_argument("--tick-ms", type=int, default=100)
    p.add_argument("--round-robin", action="store_true", help="partitions dealt in turn")
    p.add_argument(
        "--partitioner",
        choices=("crc32", "murmur"),
        default="crc32",
        help="crc32: librdkafka's default (consecutive ids alternate in a pattern); "
        "murmur: a hash with no such pattern (Java clients use murmur2)",
    )
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    records = list(generate(StreamSpec(documents=args.documents, seed=args.seed)))
    n = len(records)
    hashed = (
        (lambda k: zlib.crc32(k))
        if args.partitioner == "crc32"
        else (lambda k: mmh3.hash(k, signed=False))
    )
    part = [hashed(str(r["id"]).encode()) % args.partitions for r in records]
    per = -(-args.partitions // args.instances)
    owner_of = [
        (q % args.instances) if args.round_robin else min(q // per, args.instances - 1)
        for q in range(args.partitions)
    ]
    owner = [owner_of[q] for q in part]
    times = [int(i * args.spacing_ms) for i in range(n)]
    config = DedupConfig()
    sk = sketch([r["title"] + "\n" + r["text"] for r in records], config, config.band_plan())
    bands = len(sk.bucket_keys) // len(sk.live)
    keys: list[set[bytes]] = [set() for _ in range(n)]
    for p_, doc in enumerate(sk.live):
        keys[doc] = {*sk.bucket_keys[p_ * bands : (p_ + 1) * bands], sk.exact_keys[p_]}
    exact = sorted(range(n), key=lambda i: (times[i], part[i], i))
    ticked = sorted(range(n), key=lambda i: (times[i] // args.tick_ms, owner[i], part[i], i))
    by_exact = turns([owner[i] for i in exact])
    by_tick = turns([owner[i] for i in ticked])
    # the conflict rule over the exact order (each instance's own records in it)
    ranked = [keys[i] for i in exact]
    by_conflict = conflict_rounds(ranked, [owner[i] for i in exact], args.instances)
    deal = "round robin" if args.round_robin else "ranges"
    print(
        f"{n} documents {args.spacing_ms} ms apart, {args.partitions} partitions over "
        f"{args.instances} instances ({deal}, {args.partitioner}): serial steps (records "
        "per step)"
    )
    for name, steps in (
        ("exact order (1 ms tick)", by_exact),
        (f"{args.tick_ms} ms tick", by_tick),
        ("conflict rule (projection)", by_conflict),
    ):
        print(f"  {name}: {steps} ({n / steps:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
