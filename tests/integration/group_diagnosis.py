"""What a multi-instance run left behind for ids without events, said in its failure.

A missing event in a run of several instances killed in turn is rare and slow to
reproduce, so the failure itself must tell which of the crash cases of
``docs/shared-index.md`` ("Offsets and crashes") it was: where each missing id lies on the
input, whether the shared index holds its verdict, how far the index's stored offsets
reach on each partition against the partition's end, and the instances' last log lines.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from stream_dedup.index import DedupIndex
from stream_dedup.index.redis_backend import RedisBackend

from .support import read_topic

#: Missing ids described one by one; the rest are only counted.
SHOWN = 20
#: The instances' log lines quoted (they share one log file).
LOG_LINES = 40


def describe_missing(
    bootstrap: str,
    input_topic: str,
    partitions: int,
    index: tuple[str, str],
    missing: Collection[str],
    log: Path,
) -> str:
    """Where the ``missing`` ids are on ``input_topic``, what the index at ``index``
    (Redis URL, namespace) holds for them and for the partitions, and the log's tail."""
    wanted = set(missing)
    where: dict[str, tuple[int, int]] = {}
    ends: dict[int, int] = {}
    for msg in read_topic(bootstrap, input_topic, partitions=partitions):
        part, offset = msg.partition() or 0, msg.offset() or 0  # set on consumed messages
        ends[part] = max(ends.get(part, 0), offset + 1)
        doc_id = str(json.loads(msg.value() or b"null")["id"])
        if doc_id in wanted:
            where[doc_id] = (part, offset)
    shown = sorted(wanted)[:SHOWN]
    url, namespace = index
    opened = DedupIndex(RedisBackend(url, namespace=namespace), None)
    try:
        verdicts, _ = opened.read_decided(shown, [])
        stored = {(t, p): o for (t, p), o in opened.offsets().items() if t == input_topic}
        documents = opened.stored_documents()
    finally:
        opened.close()
    lines = [f"{len(wanted)} ids without an event; the index counts {documents} documents"]
    for doc_id, verdict in zip(shown, verdicts, strict=True):
        part, offset = where.get(doc_id, (-1, -1))
        held = "a verdict" if verdict is not None else "no verdict"
        lines.append(f"  {doc_id}: input partition {part} offset {offset}, the index holds {held}")
    for part in sorted(ends):
        lines.append(
            f"  partition {part}: end {ends[part]}, the index's stored offset "
            f"{stored.get((input_topic, part), 'none')}"
        )
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_LINES:]
    lines.append("the instances' last log lines:")
    lines.extend(f"  {line}" for line in tail)
    return "\n".join(lines)
