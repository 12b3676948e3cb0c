"""A shared index's batch write built before the lease, given its docnums inside it.

A batch decided before the lease (:mod:`.predecide`) keeps its verdicts in the lease,
but its docnums move when other instances indexed documents meanwhile, and the parts
another instance wrote near are decided again (:mod:`.redecide`). Most of its write
depends on neither: the verdict and document records name ids, clusters and payloads, not
docnums, and a bucket's members move by the same amount as the batch's first docnum
(every member at or past it is one the batch gave). So the write is built before the
lease, as :func:`~.batch_writes.decided_once` and
:func:`~stream_dedup.index.bucket_records.bucket_puts` build it (:func:`prebuild`), and
the lease only moves the docnums (one array step per kind: the document keys, the exact
texts' values, the buckets' members) and builds again the records and buckets of the
documents decided again (:func:`settled_result`). The bytes are those building it in the
lease would give (``tests/index/test_shared_settled.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U64
from stream_dedup.core.match import I64
from stream_dedup.dedup.batch import BatchResult
from stream_dedup.dedup.batch_writes import Written, matches, payloads_of, spliced, verdicts_once
from stream_dedup.index.backend import OrderedPuts
from stream_dedup.index.batch_records import BatchRecords, doc_values, empty_verdict_records
from stream_dedup.index.bucket_records import bucket_puts, moved_bucket_puts
from stream_dedup.models import Document, Verdict, VerdictKind

if TYPE_CHECKING:
    from stream_dedup.dedup.deduplicator import Decided

__all__ = ["Prebuilt", "prebuild", "settled_result"]


@dataclass(frozen=True, slots=True)
class Prebuilt:
    """A batch's write as decided before the lease, numbered from ``first``."""

    written: Written
    #: The live positions of the indexed documents (the same in the lease: parts are
    #: joined only where they index the same documents), and their records.
    indexed: I64
    doc_values: list[bytes]
    empty_keys: list[bytes]
    empty_values: list[bytes]
    #: The key filter's fingerprints of every document's verdict key, then of every live
    #: document's exact text (:func:`~.predecide.predecide`'s look-up keys).
    fingerprints: U64
    ordered: OrderedPuts
    #: The positions among the batch's bucket keys of those ``ordered`` writes.
    chosen: npt.NDArray[np.intp]
    first: int


def prebuild(parts: Decided, fingerprints: U64, bands: int) -> Prebuilt:
    """``parts``' write before the lease (a batch without repeated ids or containment)."""
    docs, sk, found = parts.docs, parts.sk, parts.found
    live_ids = [docs[i].id for i in sk.live]
    of, sim, cluster = matches(live_ids, parts.held.records, found)
    written = verdicts_once(live_ids, sk.exact_keys, (of, sim, cluster))
    indexed = np.flatnonzero(found.docnum >= 0)
    at = indexed.tolist()
    values = doc_values(
        [live_ids[p] for p in at],
        [cluster[p] for p in at],
        payloads_of(sk, parts.queries, at),
        bool(sk.payloads),
    )
    empty_ids = [d.id for d, p in zip(docs, parts.known.live_pos, strict=True) if p is None]
    empty_keys, empty_values = empty_verdict_records(empty_ids)
    ordered, chosen = bucket_puts(sk.bucket_keys, sk.bucket_order, parts.held.slot, found, bands)
    return Prebuilt(
        written,
        indexed,
        values,
        empty_keys,
        empty_values,
        fingerprints,
        ordered,
        chosen,
        parts.first,
    )


def settled_result(
    parts: Decided, pre: Prebuilt, again: npt.NDArray[np.bool_] | None, bands: int
) -> BatchResult:
    """The verdicts and write of ``parts`` (the batch as the lease settled it: its docnums
    moved, the live documents ``again`` decided again), from ``pre``: what
    :meth:`~.deduplicator.Deduplicator.result_of` gives for ``parts``."""
    docs, sk, known, found = parts.docs, parts.sk, parts.known, parts.found
    written, values = pre.written, pre.doc_values
    indexed = pre.indexed
    rebuilt = None  # the written buckets of documents decided again, by position
    if again is not None and again.any():
        written, values = _again(parts, pre, again)
        rebuilt = np.flatnonzero(again[pre.chosen // bands])
    new = np.flatnonzero(found.new_text & (found.docnum >= 0))
    live = np.asarray(sk.live, dtype=np.int64)
    empty = np.flatnonzero(np.array([p is None for p in known.live_pos], dtype=bool))
    fingerprints = pre.fingerprints
    records = BatchRecords(
        written.keys,
        written.records,
        found.docnum[indexed],
        values,
        [sk.exact_keys[p] for p in new.tolist()],
        found.docnum[new],
        pre.empty_keys,
        pre.empty_values,
        np.concatenate([fingerprints[live], fingerprints[len(docs) + new], fingerprints[empty]]),
    )
    again_buckets = None
    if rebuilt is not None:
        again_buckets = (rebuilt, pre.chosen[rebuilt], parts.held.slot, found, bands)
    ordered = moved_bucket_puts(pre.ordered, pre.first, parts.first - pre.first, again_buckets)
    counters = {  # in StagedWrite's order (COUNTERS), which the write keeps
        "documents": len(docs),
        "indexed": int(indexed.size),
        "duplicates": int(np.count_nonzero(found.match >= 0)),
        "empty": len(docs) - len(sk.live),
    }
    clock = int(parts.doc_clock[-1])  # a batch decided before the lease has documents
    return BatchResult(
        _verdicts(docs, known.live_pos, written.verdicts),
        {},
        ordered,
        counters,
        copy.copy(parts.stats),
        sk.bucket_fingerprints[pre.chosen],
        parts.epoch,
        (found.points_doc, found.points_clock),
        clock,
        records,
    )


def _again(
    parts: Decided, pre: Prebuilt, again: npt.NDArray[np.bool_]
) -> tuple[Written, list[bytes]]:
    """``pre``'s verdicts and document records with those of the live documents
    ``again`` built anew from the batch's final matching pass."""
    docs, sk, found = parts.docs, parts.sk, parts.found
    live_ids = [docs[i].id for i in sk.live]
    matched = matches(live_ids, parts.held.records, found)
    written = spliced(pre.written, again, live_ids, sk.exact_keys, matched)
    rows = np.flatnonzero(again[pre.indexed])
    at = pre.indexed[rows].tolist()
    cluster = matched[2]
    built = doc_values(
        [live_ids[p] for p in at],
        [cluster[p] for p in at],
        payloads_of(sk, parts.queries, at),
        bool(sk.payloads),
    )
    values = list(pre.doc_values)
    for r, value in zip(rows.tolist(), built, strict=True):
        values[r] = value
    return written, values


def _verdicts(
    docs: Sequence[Document], live_pos: Sequence[int | None], live: list[Verdict]
) -> list[Verdict]:
    """Every document's verdict: the live ones', and unique for empty content."""
    if len(live) == len(live_pos):
        return live
    ids = [d.id for d in docs]
    unique = VerdictKind.UNIQUE
    return [
        Verdict(i, unique, None, None, i, True) if p is None else live[p]
        for i, p in zip(ids, live_pos, strict=True)
    ]
