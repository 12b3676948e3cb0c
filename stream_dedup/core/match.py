"""A batch's documents matched against their band buckets, in order, in one pass.

Deciding a document means: take the members of its band buckets (what the index holds,
plus what earlier documents of the same batch appended), count how many bands each member
shares, verify the best-ranked ``max_candidates`` of them, keep the most similar match at
or above the threshold (ties to the earliest), and, if the document is indexed, append it
to its buckets for the documents after it. Done per document in Python, that bookkeeping
(joining bucket contents, sets of candidates, a record per candidate, a call per
verification) would be the largest share of the service's main thread's work.
:func:`match_batch` does it for the whole batch over flat arrays: the buckets' committed
members, the batch's own appends as per-bucket linked lists, and the verification payloads
of both the prefetched records and the batch's documents. What it returns is numbers only
(matched docnum, similarity, docnum given, counts); :class:`~stream_dedup.dedup.Deduplicator`
turns them into verdicts and records. The kernel and the steps it is cut into are in
:mod:`stream_dedup.core._match_kernels`; this module is its interface. A large batch runs
them compiled by numba, a small one as the same functions in Python
(:mod:`stream_dedup.core.jit`), which spares a short run loading numba.

Verification computes exact Jaccard (:func:`stream_dedup.core.verify.exact_jaccard`), but only
a match's value is used, so it gives up on a candidate as soon as it can no longer reach the
threshold (:func:`similarity_at_least`): most candidates of a large index are strangers
sharing one band. A similarity it returns is the same float ``exact_jaccard`` gives. The
tests check the whole pass against a plain per-document model of the rules.

Bucket contents follow the index's layout (:mod:`stream_dedup.index.keys`): members oldest
first, and after an append a bucket keeps its newest ``max_members``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_dedup.core import jit
from stream_dedup.core._match_kernels import _match_batch as _match_batch
from stream_dedup.core._match_kernels import least_shared as least_shared
from stream_dedup.core._match_kernels import similarity_at_least as similarity_at_least

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Matches:
    """What :func:`match_batch` decided, one entry per live document of the batch.

    ``match``: the docnum of the document's match, -1 if none; ``similarity`` its
    similarity (1.0 for an exact-text match); ``docnum``: the docnum it was indexed under,
    -1 if it was not indexed (skipped, or a duplicate under ``index_policy = "uniques"``);
    ``new_text``: it is the first indexed document with its normalised text (its exact-text
    key is written). ``exact_hits``, ``truncated`` and ``evictions`` count the batch's
    exact-text matches, cut candidate lists and bucket evictions. ``contents`` holds, at
    ``content_at[slot]`` for ``content_len[slot]`` members, the final contents of every
    bucket slot the batch appended to that is more than one new member (``content_len``
    is 0 for the others, whose contents are the one docnum appended).
    ``points_doc``/``points_clock`` are the clock change points of the documents indexed.
    """

    match: I64
    similarity: npt.NDArray[np.float64]
    candidates: I64
    verifications: I64
    docnum: I64
    new_text: npt.NDArray[np.bool_]
    exact_hits: int
    truncated: int
    evictions: int
    contents: I64
    content_at: I64
    content_len: I64
    #: The clock change points the batch added (docnums, clocks): see
    #: :mod:`stream_dedup.index.retention`.
    points_doc: I64
    points_clock: I64


def _read_only(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """A contiguous read-only view (a copy only if the type differs).

    Inputs come from the sketch worker's shared memory (read-only), from records read from
    the index or from an in-process sketch, and numba compiles the pass once per
    combination of array types; one type for every input means the kernel
    :meth:`~stream_dedup.dedup.Deduplicator.warm_up` loads is the one every batch uses.
    """
    view = np.ascontiguousarray(values, dtype=dtype).view()
    view.flags.writeable = False
    return view


#: The clock before any document time is known (retention.NO_CLOCK).
NO_CLOCK = -(1 << 62)


@dataclass(frozen=True, slots=True)
class Expiry:
    """What the matching pass needs to apply retention (see
    :mod:`stream_dedup.index.retention`): per live document its clock (the stream's clock
    when it is decided, whole seconds, ``NO_CLOCK`` if none is known), the committed
    change points (docnums, clocks), the window in seconds and the most documents held
    (0: no limit), and whether the batch opens a new epoch (its first indexed document
    then starts a change point, whatever its clock)."""

    doc_clock: I64
    points_doc: I64
    points_clock: I64
    window: int = 0
    max_documents: int = 0
    new_epoch: bool = False


def match_batch(
    *,
    fresh: npt.NDArray[np.bool_],
    text_group: I64,
    group_docnum: I64,
    slot: npt.NDArray[np.intp],
    committed: tuple[I64, I64, npt.NDArray[np.uint64]],
    bands: int,
    max_members: int,
    max_candidates: int,
    threshold: float,
    exact: bool,
    index_all: bool,
    first_docnum: int,
    payloads: tuple[npt.NDArray[np.uint32], I64, I64],
    records: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint32], I64, I64],
    older: tuple[I64, I64, npt.NDArray[np.uint64]] | None = None,
    expiry: Expiry | None = None,
) -> Matches:
    """Decide a batch's live documents in order (see the module docstring).

    Per live document ``p``: ``fresh[p]`` (False: a replay, left alone) and ``text_group[p]``
    (equal for equal normalised texts); per text group, ``group_docnum``: the docnum
    the index holds for that text, or -1 (updated in place as documents are indexed).
    Per bucket key (``bands`` per live document, row-major): ``slot``, the first key
    position with the same key, and ``committed = (at, len, members)``, the members the
    index holds for that key in the epoch the batch writes to, as a range of ``members``
    (``len`` 0: no such bucket); ``older``, the same for the members older live epochs
    hold (candidates, never rewritten). ``payloads = (flat, at, len)`` are the live
    documents' verification payloads (sets or signatures), and ``records = (docnums,
    flat, at, len)`` those of every committed document a bucket or an exact text names
    and that may still be held, ``docnums`` ascending. ``expiry`` applies retention
    (none: every document is held); a candidate or exact text below a document's cutoff
    is passed over.
    """
    com_at, com_len, com_members = committed
    n_keys = len(slot)
    if older is None:
        older = (np.zeros(n_keys, np.int64), np.zeros(n_keys, np.int64), np.empty(0, np.uint64))
    old_at, old_len, old_members = older
    n = len(fresh)
    if expiry is None:
        none = np.empty(0, np.int64)
        expiry = Expiry(np.full(n, NO_CLOCK, np.int64), none, none)
    pt_doc = np.empty(n, dtype=np.int64)  # the batch's change points
    pt_clock = np.empty(n, dtype=np.int64)
    q_flat, q_at, q_len = payloads
    r_docnums, r_flat, r_at, r_len = records
    u32, i64 = "<u4", "<i8"
    kernel = jit.choose(_match_batch, documents=n, items=com_members.size + old_members.size)
    out = kernel(
        _read_only(fresh, "?"), _read_only(text_group, i64),
        np.array(group_docnum, dtype=np.int64),  # updated as the pass indexes texts
        _read_only(slot, i64),
        (_read_only(com_at, i64), _read_only(com_len, i64), _read_only(com_members, i64)),
        (_read_only(old_at, i64), _read_only(old_len, i64), _read_only(old_members, i64)),
        (_read_only(q_flat, u32), _read_only(q_at, i64), _read_only(q_len, i64)),
        (_read_only(r_docnums, i64), _read_only(r_flat, u32), _read_only(r_at, i64),
         _read_only(r_len, i64)),
        (_read_only(expiry.doc_clock, i64), _read_only(expiry.points_doc, i64),
         _read_only(expiry.points_clock, i64), int(expiry.window), int(expiry.max_documents),
         NO_CLOCK, bool(expiry.new_epoch)),
        (pt_doc, pt_clock),
        (int(bands), int(max_members), int(max_candidates), float(threshold), bool(exact),
         bool(index_all)),
        int(first_docnum),
    )  # fmt: skip
    m, sim, cand, ver, docnum, new_text, hits, truncated, evictions, contents, at, length, end = out
    return Matches(
        m, sim, cand, ver, docnum, new_text, int(hits), int(truncated), int(evictions),
        contents, at, length, pt_doc[:end].copy(), pt_clock[:end].copy(),
    )  # fmt: skip
