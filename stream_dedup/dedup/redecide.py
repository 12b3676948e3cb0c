"""Deciding again, inside the lease, only the part of a batch another instance's write
reached (:mod:`.predecide`).

A document of a batch is decided against the index and the batch's earlier documents,
and it meets them only through its look-up keys: a band bucket or an exact text it shares
with them (its id too, but a batch with a repeated id is decided again whole). So the
batch falls into *parts*, the documents linked by shared keys, and no part's verdicts
depend on another's, but for their docnums. When another instance wrote some of the
batch's keys between the pre-decide and the lease, the parts holding a touched document
are decided again, as a batch of their own in batch order, against the index as the lease
sees it; every other part keeps what it was given. The two are joined into the matching
pass's arrays for the whole batch, so its write is built as any batch's.

Joined only where the docnums line up as deciding the whole batch would give them: the
parts decided again index the same documents as before (as a new original or as a
duplicate of the other instance's document alike, under ``index_policy = "all"``), so
every document keeps its rank among the batch's indexed ones and its docnum is ``base +
rank``. Otherwise, or when the parts to decide again are most of the batch, the whole
batch is decided again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from stream_dedup.core.match import I64, Matches
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup.batch import BatchStats

if TYPE_CHECKING:
    from stream_dedup.dedup.deduplicator import Decided, Deduplicator

__all__ = ["linked", "redecide_parts"]

#: The share of a batch's live documents above which it is decided again whole: joining
#: costs more than it saves there.
MOST = 0.5


def linked(parts: Decided, bands: int, touched: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Per live document: whether it shares a part (a chain of band buckets and exact
    texts within the batch) with a ``touched`` one (per live document)."""
    sk, known = parts.sk, parts.known
    pairs = sk.bucket_shared // bands
    starts = np.concatenate([pairs[:, 0], np.arange(len(sk.live))])
    ends = np.concatenate([pairs[:, 1], known.text_group])
    labels = np.arange(len(sk.live))
    while True:  # each document takes the least label of its part
        least = np.minimum(labels[starts], labels[ends])
        new = labels.copy()
        np.minimum.at(new, starts, least)
        np.minimum.at(new, ends, least)
        new = new[new]
        if np.array_equal(new, labels):
            break
        labels = new
    return np.isin(labels, np.unique(labels[touched]))


def redecide_parts(
    dedup: Deduplicator, kept: Decided, again: npt.NDArray[np.bool_]
) -> Decided | None:
    """``kept`` (the batch as decided before the lease, its docnums already moved to the
    lease's) with the live documents ``again`` decided again now; ``None`` where the two
    cannot be joined (see the module docstring)."""
    docs, sk = kept.docs, kept.sk
    live = np.flatnonzero(again)
    positions = [sk.live[p] for p in live.tolist()]
    sub = dedup.decide_parts([docs[i] for i in positions], subset(sk, live))
    if sub.known.repeats or not np.array_equal(sub.found.docnum >= 0, kept.found.docnum[live] >= 0):
        return None
    found = joined(kept.found, sub.found, live, sub.first, dedup.plan.bands)
    records = {**kept.held.records, **sub.held.records}
    stats = BatchStats.of(found, sk.live, len(docs))
    old = kept.stats
    stats.untimed, stats.window_without_time = old.untimed, old.window_without_time
    return replace(kept, found=found, held=replace(kept.held, records=records), stats=stats)


def joined(kept: Matches, sub: Matches, live: I64, first: int, bands: int) -> Matches:
    """The matching pass's arrays of the whole batch: ``kept``'s, with the live
    documents ``live`` taking ``sub``'s (their pass as a batch of their own, its docnums
    counted from ``first``), its docnums and bucket positions put in the batch's."""
    indexed = kept.docnum[live]
    numbers = indexed[indexed >= 0]  # sub's k-th docnum is the k-th of these

    def renumbered(values: I64) -> I64:
        inside = values >= first
        return np.where(inside, numbers[np.where(inside, values - first, 0)], values)

    match, similarity = kept.match.copy(), kept.similarity.copy()
    new_text, candidates = kept.new_text.copy(), kept.candidates.copy()
    verifications = kept.verifications.copy()
    match[live] = renumbered(sub.match)
    similarity[live], new_text[live] = sub.similarity, sub.new_text
    candidates[live], verifications[live] = sub.candidates, sub.verifications
    # Bucket positions: sub's position q * bands + j is the batch's live[q] * bands + j.
    where = (live[:, None] * bands + np.arange(bands)).reshape(-1)
    content_len = kept.content_len.copy()
    content_at = kept.content_at.copy()
    content_len[where] = sub.content_len
    content_at[where] = sub.content_at + kept.contents.size
    contents = np.concatenate([kept.contents, renumbered(sub.contents)])
    return replace(
        kept,
        match=match,
        similarity=similarity,
        new_text=new_text,
        candidates=candidates,
        verifications=verifications,
        exact_hits=kept.exact_hits + sub.exact_hits,
        truncated=kept.truncated + sub.truncated,
        evictions=kept.evictions + sub.evictions,
        contents=contents,
        content_at=content_at,
        content_len=content_len,
    )


def subset(sk: Sketch, live: I64) -> Sketch:
    """The sketch of the live documents ``live`` (positions among ``sk``'s live ones) as
    a batch of their own, in order: their keys shared only among them (see
    :func:`linked`), so the batch's key order and shared keys restricted to them are
    theirs."""
    bands = len(sk.bucket_keys) // len(sk.live)
    n_keys = len(sk.bucket_keys)
    where = (live[:, None] * bands + np.arange(bands)).reshape(-1)
    position = np.full(n_keys, -1, dtype=np.intp)
    position[where] = np.arange(where.size)
    order = position[sk.bucket_order]
    shared = position[sk.bucket_shared]
    keys, xkeys, payloads = sk.bucket_keys, sk.exact_keys, sk.payloads
    at = live.tolist()
    return replace(
        sk,
        size=len(at),
        live=list(range(len(at))),
        set_at=sk.set_at[live],
        set_len=sk.set_len[live],
        sigs=sk.sigs[live] if sk.sigs.size else sk.sigs,
        bucket_keys=[keys[i] for i in where.tolist()],
        exact_keys=[xkeys[p] for p in at],
        bucket_order=order[order >= 0],
        bucket_shared=shared[shared[:, 0] >= 0] if shared.size else shared,
        bucket_fingerprints=sk.bucket_fingerprints[where],
        payloads=[payloads[p] for p in at] if payloads else payloads,
    )
