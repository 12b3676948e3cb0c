"""What a coarser tick of the group's time order costs in verdicts: an upper bound.

Instances of one group on a shared index compare the times of records on each other's
partitions at ``index.redis.order_tick_ms`` (``docs/group-order.md``): two records on
partitions owned by different instances whose times fall in the same tick are decided
instance by instance (then by partition), not in time order. This decides a wire stream
(the generator's news,
copies following their original within seconds) in the order where *every* partition is
its own instance (the most pairs across instances there can be), for several ticks, and
counts the ids whose verdict (``verdict``, ``duplicate_of``) differs from deciding it in
produce order, the reference the group's tests hold it to (>= 99.5 % equal).

Records are ``--spacing-ms`` apart (10 in the broker tests: 100 documents a second) and
keyed over ``--partitions`` partitions by a CRC32 of the id (as librdkafka's default
partitioner does). No broker, no Redis: the bound is a property of the order alone.

    PYTHONPATH=. .venv/bin/python bench/order_tick.py -n 12000
    PYTHONPATH=. .venv/bin/python bench/order_tick.py --spacing-ms 0.1,1.25,4 --ticks 1,10,100
"""

from __future__ import annotations

import argparse
import sys
import zlib
from typing import Any

from stream_dedup import Detector, Document
from stream_dedup.tools.generate import StreamSpec, generate


def decide(records: list[dict[str, Any]], order: list[int]) -> dict[str, tuple[str, Any]]:
    """Each id's (verdict, duplicate_of), deciding ``records`` in ``order``."""
    with Detector() as detector:
        docs = [
            Document(records[i]["id"], records[i]["title"] + "\n" + records[i]["text"])
            for i in order
        ]
        out: dict[str, tuple[str, Any]] = {}
        for start in range(0, len(docs), 1000):
            for doc, v in zip(
                docs[start : start + 1000],
                detector.add_many(docs[start : start + 1000]),
                strict=True,
            ):
                out[doc.id] = (v.verdict, v.duplicate_of)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=12_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--spacing-ms", default="1,10,100", help="ms between records, a list")
    p.add_argument("--ticks", default="1,10,100,250,1000", help="ticks in ms, a list")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    records = list(generate(StreamSpec(documents=args.documents, seed=args.seed)))
    part = [zlib.crc32(str(r["id"]).encode()) % args.partitions for r in records]
    n = len(records)
    reference = decide(records, list(range(n)))
    print(f"{n} documents over {args.partitions} partitions; ids equal to produce order:")
    for spacing in (float(s) for s in args.spacing_ms.split(",")):
        cells = []
        for tick in (int(t) for t in args.ticks.split(",")):
            order = sorted(range(n), key=lambda i: (int(i * spacing) // tick, part[i], i))
            got = decide(records, order)
            equal = sum(got[k] == v for k, v in reference.items()) / n
            cells.append(f"tick {tick} ms {100 * equal:.2f} %")
        print(f"  records {spacing} ms apart: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
