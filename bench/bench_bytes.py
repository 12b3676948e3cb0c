"""Where an index's bytes go: per kind of record, per document, on RocksDB and on Redis.

Decides ``-n`` generated news-like documents (:mod:`stream_dedup.tools.generate`, ~1.3 KB
articles, ~45% re-runs) through the offline path into an index, then:

* RocksDB: scans every column family and sums key and value bytes by kind of record
  (the key's first byte: ``d`` documents, ``b`` band buckets, ``v`` verdicts, ``x`` exact
  texts, ``k`` change points, the rest the index's own), next to the files on disk after
  a full compaction (what a long-running index converges to);
* Redis (``--redis``, a ``redis-server`` started here): ``used_memory`` of ``INFO memory``
  before and after, and ``MEMORY USAGE`` of the record hashes, split by kind from the
  fields' sizes.

With ``--retention`` the index holds a window (records are 30 s apart, so ``833h`` is
100,000 documents) and the figures are per *held* document.

    .venv/bin/python bench/bench_bytes.py -n 200000
    .venv/bin/python bench/bench_bytes.py -n 100000 --redis --no-rocks
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import parse_time
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.opener import Location, RedisSettings
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention, parse_duration
from stream_dedup.models import Document
from stream_dedup.tools.generate import StreamSpec, generate

_KINDS = {"d": "documents", "b": "band buckets", "v": "verdicts", "x": "exact texts", "k": "points"}


def batches(n: int, size: int, seed: int) -> Iterator[list[Document]]:
    stream = generate(StreamSpec(documents=n, seed=seed))
    while chunk := list(itertools.islice(stream, size)):
        yield [
            Document(r["id"], r["title"] + "\n\n" + r["text"], parse_time(r["published"]))
            for r in chunk
        ]


def fill(where: Location, args: argparse.Namespace) -> tuple[int, float]:
    """Decide the stream into the index at ``where``; the documents held and seconds taken."""
    config = DedupConfig()
    retention = Retention(parse_duration(args.retention), 0)
    index = open_index(where, IndexParams.of(config), retention=retention)
    dedup = Deduplicator(index, config)
    started = time.perf_counter()
    try:
        for i, docs in enumerate(batches(args.documents, args.batch, args.seed)):
            dedup.process(docs, {("bench", 0): (i + 1) * args.batch})
        held = index.stats().held
    finally:
        index.close()
    return held, time.perf_counter() - started


def rocks_breakdown(path: Path) -> dict[str, Any]:
    """Key and value bytes by kind over every column family, and the SST bytes on disk as
    the run left them and after a full compaction (what a long-running index converges
    to: no superseded versions of appended buckets), with the index's own options."""
    from rocksdict import Options, Rdict

    from stream_dedup.index.rocks_families import docs_options, small_options

    keys: Counter[str] = Counter()
    values: Counter[str] = Counter()
    count: Counter[str] = Counter()
    families = Rdict.list_cf(str(path))
    options: dict[str, Options] = {
        f: docs_options() if f.endswith("docs") else small_options()
        for f in families
        if f != "default"
    }
    left = sst_bytes(path)
    db = Rdict(str(path), small_options(), column_families=options)
    try:
        for family in families:
            cf = db.get_column_family(family)
            cf.compact_range(None, None)
            for k, v in cf.items():
                kind = _KINDS.get(chr(k[0]), "own keys")
                keys[kind] += len(k)
                values[kind] += len(v)
                count[kind] += 1
    finally:
        db.close()
    return {
        "keys": dict(keys),
        "values": dict(values),
        "count": dict(count),
        "sst_bytes_as_left": left,
        "sst_bytes": sst_bytes(path),
        "families": len(families),
    }


def sst_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix == ".sst")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--documents", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--retention", default="none")
    p.add_argument("--redis", action="store_true", help="also measure a Redis index")
    p.add_argument("--no-rocks", action="store_true", help="skip the RocksDB index")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    out: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "documents": args.documents,
        "retention": args.retention,
    }
    with tempfile.TemporaryDirectory(prefix="bench-bytes-") as tmp:
        if not args.no_rocks:
            path = Path(tmp) / "index"
            held, seconds = fill(path, args)
            rocks = rocks_breakdown(path)
            rocks.update(held=held, seconds=round(seconds, 1))
            out["rocksdb"] = rocks
            print_table("RocksDB", rocks, held)
        if args.redis:
            out["redis"] = redis_bytes(Path(tmp), args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


def print_table(title: str, r: dict[str, Any], held: int) -> None:
    print(f"{title}: {held:,} documents held, {r['families']} column families")
    head = ("kind", "records/doc", "key B/doc", "value B/doc", "total B/doc")
    print(f"{head[0]:<14} {head[1]:>11} {head[2]:>10} {head[3]:>12} {head[4]:>12}")
    for kind in sorted(r["keys"], key=lambda k: -(r["keys"][k] + r["values"][k])):
        k, v, c = r["keys"][kind], r["values"][kind], r["count"][kind]
        per = (c / held, k / held, v / held, (k + v) / held)
        print(f"{kind:<14} {per[0]:>11.2f} {per[1]:>10.1f} {per[2]:>12.1f} {per[3]:>12.1f}")
    logical = sum(r["keys"].values()) + sum(r["values"].values())
    print(f"{'all records':<14} {'':>11} {'':>10} {'':>12} {logical / held:>12.1f}")
    print(f"{'SST as left':<14} {'':>11} {'':>10} {'':>12} {r['sst_bytes_as_left'] / held:>12.1f}")
    print(f"{'SST compacted':<14} {'':>11} {'':>10} {'':>12} {r['sst_bytes'] / held:>12.1f}")


def redis_bytes(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``used_memory`` before and after, and ``MEMORY USAGE`` of the records by kind."""
    import redis

    from stream_dedup.tools import redis_local

    with redis_local.single_node(tmp / "redis") as url:
        client = redis.Redis.from_url(url)
        before = int(client.info("memory")["used_memory"])
        held, seconds = fill(RedisSettings(url), args)
        after = int(client.info("memory")["used_memory"])
        usage: Counter[str] = Counter()
        payload: Counter[str] = Counter()
        for key in client.scan_iter(count=1000):
            usage["hash" if client.type(key) == b"hash" else "own keys"] += int(
                client.memory_usage(key, samples=0) or 0
            )
            if client.type(key) == b"hash":
                for f, v in client.hscan_iter(key, count=1000):
                    payload[_KINDS.get(chr(f[0]), "own keys")] += len(f) + len(v)
    result = {
        "held": held,
        "seconds": round(seconds, 1),
        "used_memory_delta": after - before,
        "memory_usage": dict(usage),
        "field_bytes": dict(payload),
    }
    per = (after - before) / held
    print(f"Redis: {held:,} documents held, used_memory +{after - before:,} B = {per:.1f} B/doc")
    for kind, b in sorted(payload.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<14} field+value {b / held:>8.1f} B/doc")
    print(f"  MEMORY USAGE of record hashes {usage['hash'] / held:.1f} B/doc")
    return result


if __name__ == "__main__":
    sys.exit(main())
