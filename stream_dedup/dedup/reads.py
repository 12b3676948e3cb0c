"""What deciding a batch reads: what the index knows of its ids and texts, and what it
holds that the batch's documents may match.

Each is a few batched reads of the index's typed questions
(:meth:`~stream_dedup.index.store.DedupIndex.read_decided`,
:meth:`~stream_dedup.index.store.DedupIndex.read_bucket_members`,
:meth:`~stream_dedup.index.store.DedupIndex.read_records`), turned into the arrays the
compiled matching pass (:func:`~stream_dedup.core.match.match_batch`) takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U32
from stream_dedup.core.match import I64, NO_CLOCK
from stream_dedup.core.set_cache import SetCache
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup.revisions import Repeat, RevisionMode, plan_repeats
from stream_dedup.index.store import DedupIndex, DocRecord, Members, StoredVerdict
from stream_dedup.models import Document


@dataclass(slots=True)
class Known:
    """What the index, and the batch itself, already say about the batch's documents."""

    #: Per document: the verdict its id was given before (``None``: never decided).
    stored: list[StoredVerdict | None]
    #: Per position of a document whose id was decided before (in the index or earlier
    #: in the batch): whether it replays a revision or is a new one (see
    #: :mod:`.revisions`). Empty for a batch without repeated ids.
    repeats: dict[int, Repeat]
    #: Per document: its position among the live ones (``None``: empty content).
    live_pos: list[int | None]
    #: Per live document: decided now (neither a replay nor a later repeat).
    fresh: npt.NDArray[np.bool_]
    #: Per live document its exact-text group, and per group the committed docnum with
    #: that text, -1 if none (see :func:`text_groups`).
    text_group: I64
    group_docnum: I64


def read_known(
    index: DedupIndex, docs: Sequence[Document], sk: Sketch, mode: RevisionMode = "decide"
) -> Known:
    """What the index knows of ``docs``' ids and exact texts (``sk``: their sketch);
    ``mode`` is what a repeated id with another text is (see :mod:`.revisions`)."""
    ids = [d.id for d in docs]
    n_docs = len(ids)
    stored, text_docnums = index.read_decided(ids, sk.exact_keys)
    live_pos: list[int | None] = [None] * n_docs
    for p, doc_index in enumerate(sk.live):
        live_pos[doc_index] = p
    fresh = np.ones(len(sk.live), dtype=bool)
    repeats: dict[int, Repeat] = {}
    if len(set(ids)) < n_docs or stored.count(None) < n_docs:
        xkeys = sk.exact_keys
        texts = [None if p is None else xkeys[p] for p in live_pos]
        repeats = plan_repeats(ids, texts, stored, mode)
        for i, repeat in repeats.items():
            at_live = live_pos[i]
            if at_live is not None and repeat.replay:
                fresh[at_live] = False
    text_group, group_docnum = text_groups(sk.exact_keys, text_docnums)
    return Known(stored, repeats, live_pos, fresh, text_group, group_docnum)


def text_groups(xkeys: list[bytes], committed: list[int | None]) -> tuple[I64, I64]:
    """Each live document's exact-text group (equal normalised texts share one: the last
    position with that text) and each group's committed docnum, -1 where the index holds
    none (``committed``: the docnum the index holds for each of ``xkeys``)."""
    last_with = dict(zip(xkeys, range(len(xkeys)), strict=True))
    group = np.array([last_with[x] for x in xkeys], dtype=np.int64)
    docnum = np.full(len(xkeys), -1, dtype=np.int64)
    for p, num in enumerate(committed):
        if num is not None:
            docnum[group[p]] = num
    return group, docnum


@dataclass(slots=True)
class Held:
    """What the index holds that the batch's documents may match."""

    #: Per bucket key: the first position with the same key (its slot).
    slot: npt.NDArray[np.intp]
    #: The members of each bucket key in the epoch the batch writes to, and in the other
    #: live epochs (read at each key's slot; ``None``: none).
    committed: Members
    older: Members | None
    #: The records of every held document a bucket or an exact text names, by docnum
    #: (ascending); the batch's indexed documents join them as they are decided.
    records: dict[int, DocRecord]


def read_held(
    index: DedupIndex, sk: Sketch, known: Known, epoch: int, below: int | None = None
) -> Held:
    """The bucket members and candidate records for a batch that writes to ``epoch``.

    Only documents still held (at or after the index's cutoff) are read: an expired one
    is no candidate, whatever a bucket of an older epoch still lists. ``below``: only
    documents numbered below it are read (outside a shared index's lease, a bucket may
    already hold a newer write's documents, which the batch is decided again for).
    """
    bkeys = sk.bucket_keys
    committed, older = index.read_bucket_members(bkeys, sk.bucket_fingerprints, epoch)
    if below is not None:
        committed = members_below(committed, below)
        older = None if older is None else members_below(older, below)
    slot = np.arange(len(bkeys), dtype=np.intp)
    slot[sk.bucket_shared[:, 0]] = sk.bucket_shared[:, 1]
    old = None if older is None else (older[0][slot], older[1][slot], older[2])
    cutoff = index.cutoff()  # nothing older is held by any document of the batch
    group_docnum = known.group_docnum
    wanted = set(group_docnum[group_docnum >= cutoff].tolist())
    members = [committed[2]] if old is None else [committed[2], old[2]]
    wanted.update(m for m in np.unique(np.concatenate(members)).tolist() if m >= cutoff)
    if below is not None:  # no record of a newer write: its numbers are the batch's own
        wanted = {m for m in wanted if m < below}
    return Held(slot, committed, old, index.read_records(sorted(wanted)))


def members_below(members: Members, below: int) -> Members:
    """``members`` without the documents numbered ``below`` or after: the tail of each
    bucket's list (a bucket's members are in docnum order, a write appends newer ones)."""
    at, length, flat = members
    kept = np.concatenate([[0], np.cumsum(flat < below)])
    return at, kept[at + length] - kept[at], flat


def clocks(docs: Sequence[Document], committed: int) -> I64:
    """The stream's clock as each of ``docs`` is decided: the latest time so far, in whole
    seconds, starting from the ``committed`` clock (``NO_CLOCK`` while none is known)."""
    seconds = np.fromiter(
        (NO_CLOCK if d.time is None else d.time // 1000 for d in docs),
        dtype=np.int64,
        count=len(docs),
    )
    if not seconds.size:
        return seconds
    seconds[0] = max(int(seconds[0]), committed)
    return np.maximum.accumulate(seconds)


def payloads(
    records: dict[int, DocRecord],
    cache: SetCache | None = None,
    needed: npt.NDArray[np.bool_] | None = None,
) -> tuple[npt.NDArray[np.uint64], U32, I64, I64]:
    """The verification payloads of ``records`` as :func:`match_batch` takes them (docnums
    ascending: ``records`` is filled in that order).

    A record holding compressed text (index format 4) gives the verification set rebuilt
    from it, through ``cache`` (:class:`~stream_dedup.core.set_cache.SetCache`); one holding
    a set or a signature gives it as stored. A text record that ``needed`` (per record)
    leaves out gives an empty set, not rebuilt: :mod:`.prune` has shown it cannot reach
    the threshold with any document that meets it.
    """
    docnums = np.fromiter(records, dtype=np.uint64, count=len(records))
    flat, at, lengths = joined(payload_arrays(records, cache, needed))
    return docnums, flat, at, lengths


def joined(arrays: Sequence[U32]) -> tuple[U32, I64, I64]:
    """``arrays`` end to end, as ``(flat, start, length)``."""
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays).astype("<u4", copy=False) if arrays else np.empty(0, "<u4")
    return flat, np.cumsum(lengths) - lengths, lengths


def payload_arrays(
    records: dict[int, DocRecord],
    cache: SetCache | None = None,
    needed: npt.NDArray[np.bool_] | None = None,
) -> list[U32]:
    """Each record's verification payload, as :func:`payloads` gives them."""
    held = list(records.values())
    texts = [r.payload for r in held if r.text]
    if not texts:
        return [np.frombuffer(r.payload, dtype="<u4") for r in held]
    if cache is None:
        raise ValueError("records hold compressed texts: a SetCache must rebuild their sets")
    if needed is None:
        wanted = [r.text for r in held]
    else:
        wanted = [r.text and bool(w) for r, w in zip(held, needed.tolist(), strict=True)]
        n_texts = len(texts)
        texts = [r.payload for r, w in zip(held, wanted, strict=True) if w]
        cache.skipped += n_texts - len(texts)
    text_docnums = [d for d, w in zip(records, wanted, strict=True) if w]
    rebuilt = iter(cache.sets(text_docnums, texts))
    empty = np.empty(0, dtype="<u4")
    return [
        next(rebuilt) if w else empty if r.text else np.frombuffer(r.payload, dtype="<u4")
        for r, w in zip(held, wanted, strict=True)
    ]
