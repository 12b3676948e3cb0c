"""Deciding a batch of a shared index before its lease, and settling it inside.

Under the lease a batch used to be decided whole: its reads, the matching pass, its
verdicts and records, most of the time the lease is held (``docs/shared-index.md``,
Sizing). Deciding reads only the index, so the same batch can be decided before the
lease against the index as of one version ``V`` of its change log
(:meth:`~stream_dedup.index.store.DedupIndex.as_of`: the counters, epochs and key filters
of ``V``, the writes waiting at ``V`` read through): its reads, its matching pass, and
its verdicts and write, numbered as decided (:mod:`.settled`). Inside the lease, the log
past ``V`` says which look-up keys the other instances wrote since. Another instance's write can
change a document's verdict only through those keys (its id: a replay; its exact text: a
repeat; a band bucket: a new candidate), so a batch none of whose keys was written is
decided exactly as it would be inside the lease, but for its docnums: they are counted
from the ``indexed`` counter, which the others moved. Those are moved by the same amount
(every number the batch gave is at or after the one it started from, every number it
read is before it), and so are the write's (one array step per kind of number).

Where that cannot be shown, the batch is decided again, whole, inside the lease, as
before: a key of the batch was written past ``V`` (its *touched* documents are counted),
the log cannot tell, the batch's epoch, the cut-off, the live epochs, the retention or
the clock its documents are decided at changed, or documents were indexed meanwhile under
a retention (its expiry is measured in docnums and clock points). Containment (sampled
keys read beside the buckets) is always decided inside the lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U64
from stream_dedup.core.match import I64
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup.batch import BatchResult
from stream_dedup.dedup.reads import clocks
from stream_dedup.dedup.redecide import MOST, linked, redecide_parts
from stream_dedup.dedup.settled import Prebuilt, prebuild, settled_result
from stream_dedup.errors import IndexCorruptError
from stream_dedup.index.retention import NO_RETENTION, Retention
from stream_dedup.models import Document

if TYPE_CHECKING:
    from stream_dedup.dedup.deduplicator import Decided, Deduplicator

__all__ = ["PredecideCounts", "Predecided", "predecide", "settle"]


@dataclass(frozen=True, slots=True)
class Predecided:
    """A batch decided before the lease, and the state it was decided at."""

    parts: Decided
    #: The change log's version the batch was decided as of.
    version: int
    cutoff: int
    epochs: tuple[int, ...]
    retention: Retention
    #: The fingerprints of the batch's look-up keys (ids' verdict keys, exact texts,
    #: band buckets), each once and sorted, and per look-up key (``owner``: the position
    #: in the batch of its document) its place among them: sorted before the lease, so
    #: that inside it finding the touched documents is one binary search.
    lookups: U64
    place: I64
    owner: I64
    #: Where the runs of ``lookups`` start (:func:`_runs`).
    runs: I64
    #: Its write, numbered as decided (:mod:`.settled`; ``None``: a batch with repeated
    #: ids, built a document at a time in the lease).
    built: Prebuilt | None


@dataclass(slots=True)
class PredecideCounts:
    """How the batches decided before the lease were settled inside it."""

    #: Batches decided before the lease.
    batches: int = 0
    #: Kept as decided, docnums unchanged (no document was indexed past the version).
    kept: int = 0
    #: Kept, their docnums moved (other instances indexed documents meanwhile).
    moved: int = 0
    #: Kept but for the parts holding a touched document, decided again inside the lease
    #: (:mod:`.redecide`).
    partly: int = 0
    #: Decided again inside the lease, whole.
    redecided: int = 0
    #: Documents decided again inside the lease, in whole batches or in parts.
    redecided_docs: int = 0
    #: Documents with a look-up key another instance wrote between the pre-decide and
    #: the lease.
    touched_docs: int = 0


def predecide(
    dedup: Deduplicator, docs: Sequence[Document], sketched: Sketch | None = None
) -> Predecided | None:
    """``docs`` decided before the lease, against the index as of its latest version;
    ``None`` where this index or configuration decides inside the lease only."""
    index = dedup.index
    if not docs or not index.shared or dedup.config.containment:
        return None
    dedup.after_lease()  # what the last batch left: before this batch's reads, as decide
    with index.as_of() as version:
        if version is None:
            return None
        try:
            parts = dedup.decide_parts(docs, sketched, ahead=True)
        except IndexCorruptError:  # a newer write read half applied: decide in the lease
            return None
        cutoff, epochs = index.cutoff(), tuple(index.timeline.numbers())
        retention = index.retention
    dedup.predecided.batches += 1
    fingerprints, owner = _lookups(dedup, parts)
    lookups, place = np.unique(fingerprints, return_inverse=True)
    built = None if parts.known.repeats else prebuild(parts, fingerprints, dedup.plan.bands)
    place = place.astype(np.int64)
    runs = _runs(lookups)
    return Predecided(parts, version, cutoff, epochs, retention, lookups, place, owner, runs, built)


def settle(dedup: Deduplicator, pre: Predecided) -> BatchResult | None:
    """Inside the lease: ``pre``'s result as deciding the batch now would give it, or
    ``None`` when the batch must be decided again whole (see the module docstring)."""
    index, parts, counts = dedup.index, pre.parts, dedup.predecided
    written = index.written_since()
    moved_by = index.counter("indexed") - parts.first
    same = (
        written is not None
        and index.batch_epoch() == parts.epoch
        and index.cutoff() == pre.cutoff
        and tuple(index.timeline.numbers()) == pre.epochs
        and index.retention == pre.retention
        and (moved_by == 0 or pre.retention == NO_RETENTION)
        and np.array_equal(clocks(parts.docs, index.timeline.clock), parts.doc_clock)
    )
    touched = np.zeros(len(parts.docs), dtype=bool)
    if same and written:
        keys = np.concatenate([fingerprints for _, fingerprints in written])
        touched[pre.owner[_written(pre.lookups, pre.runs, keys)[pre.place]]] = True
    n_touched = int(np.count_nonzero(touched))
    counts.touched_docs += n_touched
    if same and moved_by:
        parts = moved(parts, moved_by)
    again = None
    if same and n_touched:
        parts_again = _in_part(dedup, pre, parts, touched)
        if parts_again is None:
            same = False
        else:
            parts, again = parts_again
            counts.partly += 1
            counts.redecided_docs += int(np.count_nonzero(again))
    if not same:
        counts.redecided += 1
        counts.redecided_docs += len(parts.docs)
        return None
    # The write built before the lease, given its docnums, and the records of the
    # documents decided again built anew (:mod:`.settled`).
    if pre.built is None:
        result = dedup.result_of(parts)
    else:
        result = settled_result(parts, pre.built, again, dedup.plan.bands)
    if not n_touched:
        counts.kept += moved_by == 0
        counts.moved += moved_by != 0
    dedup.leave_for_later(parts.sk, parts.found)
    return result


def _in_part(
    dedup: Deduplicator, pre: Predecided, parts: Decided, touched: npt.NDArray[np.bool_]
) -> tuple[Decided, npt.NDArray[np.bool_]] | None:
    """``parts`` with the parts of the batch holding a ``touched`` document decided again
    (:mod:`.redecide`), and which live documents those were; ``None`` where the whole
    batch must be."""
    known = parts.known
    if pre.retention != NO_RETENTION or known.repeats:
        return None
    live_touched = np.zeros(len(parts.sk.live), dtype=bool)
    for i in np.flatnonzero(touched).tolist():
        p = known.live_pos[i]
        if p is None:  # an empty document's id was written: a replay
            return None
        live_touched[p] = True
    again = linked(parts, dedup.plan.bands, live_touched)
    n_again = int(np.count_nonzero(again))
    if n_again > MOST * again.size:
        return None
    joined = redecide_parts(dedup, parts, again)
    return None if joined is None else (joined, again)


def moved(parts: Decided, by: int) -> Decided:
    """``parts`` with the docnums the batch gave moved ``by`` on: those at or after the
    first it gave, wherever they stand (its documents', their matches, the buckets'
    final contents, the clock points); the numbers it read are all before it."""
    found, first = parts.found, parts.first

    def up(numbers: I64) -> I64:
        return np.where(numbers >= first, numbers + by, numbers)

    shifted = replace(
        found,
        match=up(found.match),
        docnum=up(found.docnum),
        contents=up(found.contents),
        points_doc=up(found.points_doc),
    )
    return replace(parts, found=shifted, first=first + by)


#: The high bits of a fingerprint that pick its run among the batch's sorted look-up
#: fingerprints (:func:`_runs`): 65,536 runs for a batch's ~44,000, most of them empty or
#: of one.
_RUN_BITS = 16


def _runs(lookups: U64) -> I64:
    """Where each run of ``lookups`` (sorted) with the same high :data:`_RUN_BITS` bits
    starts, and the end: built before the lease, so that inside it a written fingerprint
    is found by a look-up of its run, not a binary search of the whole batch's."""
    high = (lookups >> np.uint64(64 - _RUN_BITS)).astype(np.intp)
    starts = np.zeros((1 << _RUN_BITS) + 1, dtype=np.int64)
    np.cumsum(np.bincount(high, minlength=1 << _RUN_BITS), out=starts[1:])
    return starts


def _written(lookups: U64, runs: I64, keys: U64) -> npt.NDArray[np.bool_]:
    """Per fingerprint of ``lookups`` (sorted, each once; ``runs``: :func:`_runs`):
    whether ``keys`` hold it. Each key is compared with the members of its run, one
    member of every run at a time (runs hold a few at most)."""
    high = (keys >> np.uint64(64 - _RUN_BITS)).astype(np.intp)
    at, end = runs[high], runs[high + 1]
    hit = np.zeros(lookups.size, dtype=bool)
    while at.size:
        more = at < end
        at, end, keys = at[more], end[more], keys[more]
        hit[at[lookups[at] == keys]] = True
        at = at + 1
    return hit


def _lookups(dedup: Deduplicator, parts: Decided) -> tuple[U64, I64]:
    """The fingerprints of every look-up key the batch read or may read, each with its
    document's position in the batch."""
    docs, sk = parts.docs, parts.sk
    keys = dedup.index.lookup_fingerprints([d.id for d in docs], sk.exact_keys)
    live = np.asarray(sk.live, dtype=np.int64)
    owner = np.concatenate(
        [np.arange(len(docs), dtype=np.int64), live, np.repeat(live, dedup.plan.bands)]
    )
    return np.concatenate([keys, sk.bucket_fingerprints]), owner
