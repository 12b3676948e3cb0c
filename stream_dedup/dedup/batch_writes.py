"""Verdicts and index writes of a batch whose documents are each decided once.

The common batch, every id new, needs none of the per-document steps of
:func:`~.writes.verdicts_and_writes` (a repeat reading the verdict staged before it;
containment's fields are added afterwards, to the verdicts they name): its verdicts
follow from the matching pass's arrays, and its records are built list by list
(:mod:`stream_dedup.index.batch_records`). On a shared index this runs inside the lease,
where the step per document was most of the deciding (before it, for a batch decided
there: :mod:`.settled`). The one dependency between
documents, a duplicate of a document indexed earlier in the same batch taking that
document's cluster, is resolved in batch order over the duplicates alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U32
from stream_dedup.core.match import I64, Matches
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup.reads import Known
from stream_dedup.index.batch_records import (
    doc_records,
    empty_verdict_records,
    exact_values,
    verdict_records,
)
from stream_dedup.index.staged import StagedWrite
from stream_dedup.index.store import DocRecord
from stream_dedup.models import Document, Verdict, VerdictKind

__all__ = ["Written", "decided_once", "matches", "payloads_of", "spliced", "verdicts_once"]

_UNIQUE, _DUPLICATE = VerdictKind.UNIQUE, VerdictKind.DUPLICATE


@dataclass(frozen=True, slots=True)
class Written:
    """The live documents' verdicts and verdict records (keys, records) of a batch
    decided once: nothing in them depends on docnums, so a batch decided before a shared
    index's lease builds them there, and the lease rebuilds those of the documents it
    decides again only (:mod:`.settled`)."""

    verdicts: list[Verdict]
    keys: list[bytes]
    records: list[bytes]


def verdicts_once(
    live_ids: list[str],
    exact_keys: Sequence[bytes],
    matched: tuple[list[str | None], list[float | None], list[str]],
) -> Written:
    """The verdicts and verdict records of live documents ``live_ids`` (their exact
    keys, and ``matched``: what :func:`matches` gives for them)."""
    of, sim, cluster = matched
    verdicts = [
        Verdict(i, _UNIQUE if o is None else _DUPLICATE, o, s, c)
        for i, o, s, c in zip(live_ids, of, sim, cluster, strict=True)
    ]
    return Written(verdicts, *verdict_records(live_ids, of, sim, cluster, exact_keys))


def decided_once(
    docs: Sequence[Document],
    sk: Sketch,
    known: Known,
    records: dict[int, DocRecord],
    found: Matches,
    queries: tuple[U32, I64, I64],
) -> tuple[list[Verdict], StagedWrite]:
    """Each document's verdict and the batch's writes, as
    :func:`~.writes.verdicts_and_writes` gives them for a batch without repeated ids
    (before containment's fields); ``records`` (the candidates' records) is only read."""
    ids = [d.id for d in docs]
    live_ids = [ids[i] for i in sk.live]
    of, sim, cluster = matches(live_ids, records, found)
    written = verdicts_once(live_ids, sk.exact_keys, (of, sim, cluster))
    live_verdicts = written.verdicts
    staged = StagedWrite()
    staged.records(written.keys, written.records)
    indexed = np.flatnonzero(found.docnum >= 0)
    at, nums = indexed.tolist(), found.docnum[indexed].tolist()
    doc_ids, doc_clusters = [live_ids[p] for p in at], [cluster[p] for p in at]
    payloads = payloads_of(sk, queries, at)
    staged.records(*doc_records(nums, doc_ids, doc_clusters, payloads, bool(sk.payloads)))
    new = np.flatnonzero(found.new_text & (found.docnum >= 0))
    texts = [sk.exact_keys[p] for p in new.tolist()]
    staged.records(texts, exact_values(found.docnum[new].tolist()))
    verdicts = live_verdicts
    if len(live_ids) != len(ids):  # empty content: unique, not indexed
        empty = [d for d, p in zip(ids, known.live_pos, strict=True) if p is None]
        staged.records(*empty_verdict_records(empty))
        verdicts = [
            Verdict(i, _UNIQUE, None, None, i, True) if p is None else live_verdicts[p]
            for i, p in zip(ids, known.live_pos, strict=True)
        ]
    staged.count(
        {
            "documents": len(ids),
            "duplicates": int(np.count_nonzero(found.match >= 0)),
            "empty": len(ids) - len(live_ids),
            "indexed": len(at),
        }
    )
    return verdicts, staged


def spliced(
    written: Written,
    again: npt.NDArray[np.bool_],
    live_ids: list[str],
    exact_keys: Sequence[bytes],
    matched: tuple[list[str | None], list[float | None], list[str]],
) -> Written:
    """``written`` with the verdicts of the live documents ``again`` built anew."""
    at = np.flatnonzero(again).tolist()
    of, sim, cluster = matched
    new = verdicts_once(
        [live_ids[p] for p in at],
        [exact_keys[p] for p in at],
        ([of[p] for p in at], [sim[p] for p in at], [cluster[p] for p in at]),
    )
    verdicts, records = list(written.verdicts), list(written.records)
    for p, verdict, record in zip(at, new.verdicts, new.records, strict=True):
        verdicts[p], records[p] = verdict, record
    return Written(verdicts, written.keys, records)


def matches(
    live_ids: list[str], records: dict[int, DocRecord], found: Matches
) -> tuple[list[str | None], list[float | None], list[str]]:
    """Per live document: the id it duplicates (``None``: unique), the similarity, and
    its cluster. A match indexed earlier in this batch gives the cluster that document
    was given (matches only point back, so batch order resolves every one)."""
    n = len(live_ids)
    of: list[str | None] = [None] * n
    sim: list[float | None] = [None] * n
    cluster = list(live_ids)
    dups = np.flatnonzero(found.match >= 0)
    if not dups.size:
        return of, sim, cluster
    given = np.flatnonzero(found.docnum >= 0)
    owner = dict(zip(found.docnum[given].tolist(), given.tolist(), strict=True))
    sims = found.similarity[dups].tolist()
    for p, n_match, s in zip(dups.tolist(), found.match[dups].tolist(), sims, strict=True):
        rec = records.get(n_match)
        if rec is None:
            q = owner[n_match]
            of[p], cluster[p] = live_ids[q], cluster[q]
        else:
            of[p], cluster[p] = rec.doc_id, rec.cluster_id
        sim[p] = round(s, 6)
    return of, sim, cluster


def payloads_of(sk: Sketch, queries: tuple[U32, I64, I64], at: list[int]) -> list[bytes]:
    """What the records of the live documents ``at`` store: their compressed texts when
    the sketch holds them (exact verification), else their verification payloads."""
    if sk.payloads:
        return [sk.payloads[p] for p in at]
    q_flat, q_at, q_len = queries
    raw = q_flat.tobytes()
    starts, ends = (4 * q_at[at]).tolist(), (4 * (q_at[at] + q_len[at])).tolist()
    return [raw[a:b] for a, b in zip(starts, ends, strict=True)]
