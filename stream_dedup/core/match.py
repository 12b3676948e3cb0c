"""A batch's documents matched against their band buckets, in order, in one compiled pass.

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
turns them into verdicts and records.

Verification computes exact Jaccard (:func:`stream_dedup.core.verify.exact_jaccard`), but only
a match's value is used, so it gives up on a candidate as soon as it can no longer reach the
threshold (:func:`similarity_at_least`): most candidates of a large index are strangers
sharing one band. A similarity it returns is the same float ``exact_jaccard`` gives. The
tests check the whole pass against a plain per-document model of the rules.

Bucket contents follow the index's layout (:mod:`stream_dedup.index.keys`): members oldest
first, and after an append a bucket keeps its newest ``max_members``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from stream_dedup.core._kernels import intersection_at_least

_JIT: dict[str, Any] = {"nogil": True, "cache": True, "boundscheck": False}

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


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def least_shared(total: int, threshold: float) -> int:
    """The least shared count m with ``m / (total - m) >= threshold``, as floats compare.

    The estimate from the algebra is corrected by the comparison itself, so the bound never
    gives up on a pair that :func:`~stream_dedup.core.verify.exact_jaccard` would put at the
    threshold.
    """
    m = max(0, math.ceil(threshold * total / (1 + threshold)) - 1)
    while m > 0 and (m - 1) / (total - m + 1) >= threshold:
        m -= 1
    while m < total and m / (total - m) < threshold:
        m += 1
    return m


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def similarity_at_least(a: Any, b: Any, threshold: float) -> float:
    """Exact Jaccard of two sorted sets of distinct values if it is at least ``threshold``,
    else -1.0.

    A pair whose sizes alone rule the threshold out is not merged, and the merge stops as
    soon as the shared count can no longer reach it, so a candidate far below the
    threshold is given up after a few hundred steps instead of the whole merge.
    """
    total = a.size + b.size
    if a.size == 0 or b.size == 0:
        return 0.0 if threshold <= 0.0 else -1.0
    need = least_shared(total, threshold)
    if need > min(a.size, b.size):
        return -1.0
    inter = intersection_at_least(a, b, need)
    if inter < 0:
        return -1.0
    sim = inter / (total - inter)
    return sim if sim >= threshold else -1.0


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _similarity(a: Any, b: Any, exact: bool, threshold: float) -> float:
    """Exact: :func:`similarity_at_least`; signature: the fraction of equal positions."""
    if not exact:
        equal = 0
        for i in range(a.size):
            equal += a[i] == b[i]
        return equal / a.size  # type: ignore[no-any-return]
    return similarity_at_least(a, b, threshold)  # type: ignore[no-any-return]


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _members_into(
    out: Any, at: int, skip: int, committed: Any, head: int, app_doc: Any, app_next: Any
) -> int:
    """Write one bucket's members, oldest first (``committed``, then the batch's appends
    from ``head`` on), leaving out the first ``skip``, to ``out`` from ``at``; returns the
    position after the last one written."""
    for member in committed:
        if skip > 0:
            skip -= 1
        else:
            out[at] = member
            at += 1
    e = head
    while e >= 0:
        if skip > 0:
            skip -= 1
        else:
            out[at] = app_doc[e]
            at += 1
        e = app_next[e]
    return at


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _match_batch(
    fresh: Any,
    text_group: Any,
    group_docnum: Any,
    slot: Any,
    com_at: Any,
    com_len: Any,
    com_members: Any,
    old_at: Any,
    old_len: Any,
    old_members: Any,
    bands: int,
    max_members: int,
    max_candidates: int,
    threshold: float,
    exact: bool,
    index_all: bool,
    first_docnum: int,
    q_flat: Any,
    q_at: Any,
    q_len: Any,
    r_docnums: Any,
    r_flat: Any,
    r_at: Any,
    r_len: Any,
    doc_clock: Any,
    cp_doc: Any,
    cp_clock: Any,
    pt_doc: Any,
    pt_clock: Any,
    window: int,
    max_docs: int,
    no_clock: int,
    point_first: bool,
) -> tuple[Any, ...]:
    """The pass over the batch; :func:`match_batch` documents the arguments and results.

    A bucket's contents are read where they are (its committed members, then its appends)
    rather than copied per append, and each document's members are gathered into one
    scratch array, sorted and counted; a document without candidates allocates nothing.
    """
    n = fresh.size
    n_keys = slot.size
    match = np.full(n, -1, dtype=np.int64)
    similarity = np.zeros(n, dtype=np.float64)
    n_cand = np.zeros(n, dtype=np.int64)
    n_ver = np.zeros(n, dtype=np.int64)
    docnum = np.full(n, -1, dtype=np.int64)
    new_text = np.zeros(n, dtype=np.bool_)
    pos_of = np.empty(n, dtype=np.int64)  # docnum - first_docnum -> live position
    # The batch's appends: one linked list per slot, oldest first.
    app_head = np.full(n_keys, -1, dtype=np.int64)
    app_tail = np.full(n_keys, -1, dtype=np.int64)
    app_count = np.zeros(n_keys, dtype=np.int64)
    app_doc = np.empty(n_keys, dtype=np.int64)
    app_next = np.empty(n_keys, dtype=np.int64)
    n_app = 0
    exact_hits = 0
    truncated = 0
    evictions = 0
    scratch = np.empty(64, dtype=np.int64)
    next_docnum = first_docnum
    n_pts = 0
    for p in range(n):
        if not fresh[p]:
            continue
        # The first docnum still held for this document (retention.first_held).
        # Change points: the committed ones (cp_*), then the batch's (pt_*, n_pts so far).
        lo = 0
        if window > 0 and doc_clock[p] != no_clock and cp_doc.size + n_pts > 0:
            t = doc_clock[p] - window
            j = np.searchsorted(cp_clock, t)
            if j < cp_doc.size:
                if j > 0:
                    lo = cp_doc[j]
            else:
                k = np.searchsorted(pt_clock[:n_pts], t)
                if k < n_pts:
                    if cp_doc.size + k > 0:
                        lo = pt_doc[k]
                else:
                    lo = next_docnum
        if max_docs > 0:
            lo = max(lo, next_docnum - max_docs)
        g = text_group[p]
        found = -1
        best_sim = -1.0
        if group_docnum[g] >= lo and group_docnum[g] >= 0:
            found = group_docnum[g]
            best_sim = 1.0
            n_cand[p] = 1
            exact_hits += 1
        else:
            # Gather the members of the document's buckets as they are now.
            size = 0
            for b in range(bands):
                s = slot[p * bands + b]
                c = com_len[s]
                if app_count[s] > 0:
                    c = min(max_members, c + app_count[s])
                size += c + old_len[s]
            if size > 0:
                if size > scratch.size:
                    scratch = np.empty(2 * size, dtype=np.int64)
                k = 0
                for b in range(bands):
                    s = slot[p * bands + b]
                    for i in range(old_at[s], old_at[s] + old_len[s]):
                        scratch[k] = old_members[i]
                        k += 1
                    total = com_len[s] + app_count[s]
                    skip = max(0, total - max_members) if app_count[s] > 0 else 0
                    k = _members_into(
                        scratch, k, skip, com_members[com_at[s] : com_at[s] + com_len[s]],
                        app_head[s], app_doc, app_next,
                    )  # fmt: skip
                members = np.sort(scratch[:k])
                if lo > 0:  # expired members are no candidates
                    members = members[np.searchsorted(members, lo) :]
                    k = members.size
                # Distinct members and how many of the document's bands each shares.
                starts = np.empty(k, dtype=np.int64)
                u = 0
                for i in range(k):
                    if i == 0 or members[i] != members[i - 1]:
                        starts[u] = i
                        u += 1
                unique = np.empty(u, dtype=np.int64)
                counts = np.empty(u, dtype=np.int64)
                for j in range(u):
                    end = starts[j + 1] if j + 1 < u else k
                    unique[j] = members[starts[j]]
                    counts[j] = end - starts[j]
                n_cand[p] = u
                chosen = unique
                if u > max_candidates:
                    truncated += 1
                    # Most shared bands first, then the earliest (stable on docnum order).
                    order = np.argsort(-counts, kind="mergesort")[:max_candidates]
                    chosen = unique[order]
                n_ver[p] = chosen.size
                qa = q_flat[q_at[p] : q_at[p] + q_len[p]]
                for j in range(chosen.size):
                    d = chosen[j]
                    if d >= first_docnum:
                        o = pos_of[d - first_docnum]
                        other = q_flat[q_at[o] : q_at[o] + q_len[o]]
                    else:
                        r = np.searchsorted(r_docnums, d)
                        other = r_flat[r_at[r] : r_at[r] + r_len[r]]
                    sim = _similarity(qa, other, exact, threshold)
                    if sim < threshold:
                        continue
                    if sim > best_sim or (sim == best_sim and d < found):
                        best_sim = sim
                        found = d
        if found >= 0:
            match[p] = found
            similarity[p] = best_sim
        if index_all or found < 0:
            num = next_docnum
            next_docnum += 1
            docnum[p] = num
            pos_of[num - first_docnum] = p
            if group_docnum[g] < lo or group_docnum[g] < 0:  # none held with this text
                group_docnum[g] = num
                new_text[p] = True
            c = doc_clock[p]
            last = c - 1
            if n_pts > 0:
                last = pt_clock[n_pts - 1]
            elif cp_clock.size > 0:
                last = cp_clock[cp_clock.size - 1]
            if c != no_clock and (c > last or (point_first and num == first_docnum)):
                pt_doc[n_pts] = num
                pt_clock[n_pts] = c
                n_pts += 1
            for b in range(bands):
                s = slot[p * bands + b]
                held = com_len[s]
                if app_count[s] > 0:
                    held = min(max_members, held + app_count[s])
                if held >= max_members:
                    evictions += 1
                app_doc[n_app] = num
                app_next[n_app] = -1
                if app_tail[s] >= 0:
                    app_next[app_tail[s]] = n_app
                else:
                    app_head[s] = n_app
                app_tail[s] = n_app
                app_count[s] += 1
                n_app += 1
    # Final contents of every slot that is more than one new member.
    content_at = np.zeros(n_keys, dtype=np.int64)
    content_len = np.zeros(n_keys, dtype=np.int64)
    total_len = 0
    for s in range(n_keys):
        if app_count[s] > 0 and (com_len[s] > 0 or app_count[s] > 1):
            content_len[s] = min(max_members, com_len[s] + app_count[s])
            total_len += content_len[s]
    contents = np.empty(total_len, dtype=np.int64)
    w = 0
    for s in range(n_keys):
        if content_len[s] == 0:
            continue
        content_at[s] = w
        skip = com_len[s] + app_count[s] - content_len[s]
        w = _members_into(
            contents, w, skip, com_members[com_at[s] : com_at[s] + com_len[s]],
            app_head[s], app_doc, app_next,
        )  # fmt: skip
    return (
        match, similarity, n_cand, n_ver, docnum, new_text,
        exact_hits, truncated, evictions, contents, content_at, content_len, n_pts,
    )  # fmt: skip


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
    out = _match_batch(
        _read_only(fresh, "?"), _read_only(text_group, i64),
        np.array(group_docnum, dtype=np.int64),  # updated as the pass indexes texts
        _read_only(slot, i64), _read_only(com_at, i64), _read_only(com_len, i64),
        _read_only(com_members, i64),
        _read_only(old_at, i64), _read_only(old_len, i64), _read_only(old_members, i64),
        bands, max_members, max_candidates, float(threshold), exact, index_all, first_docnum,
        _read_only(q_flat, u32), _read_only(q_at, i64), _read_only(q_len, i64),
        _read_only(r_docnums, i64), _read_only(r_flat, u32), _read_only(r_at, i64),
        _read_only(r_len, i64),
        _read_only(expiry.doc_clock, i64),
        _read_only(expiry.points_doc, i64), _read_only(expiry.points_clock, i64), pt_doc, pt_clock,
        int(expiry.window), int(expiry.max_documents), NO_CLOCK, bool(expiry.new_epoch),
    )  # fmt: skip
    m, sim, cand, ver, docnum, new_text, hits, truncated, evictions, contents, at, length, end = out
    return Matches(
        m, sim, cand, ver, docnum, new_text, int(hits), int(truncated), int(evictions),
        contents, at, length, pt_doc[:end].copy(), pt_clock[:end].copy(),
    )  # fmt: skip
