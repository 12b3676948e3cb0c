"""The matching pass's kernel and the steps it is cut into, compiled by numba or run as Python.

:func:`stream_dedup.core.match.match_batch` describes the pass, its arguments and its
results. :func:`_match_batch` walks the batch's live documents in order and calls one
helper per step. The helpers sit in the kernel's module because numba's on-disk cache
checks only the source file of the function it caches: a helper elsewhere could change
unseen by the cached kernel. The same functions run as plain Python for a small batch
(:mod:`stream_dedup.core.jit`): the compiled and the Python pass are one source.

LLVM inlines only small helpers, and a call per document or per bucket costs about as
much as the step itself (a document takes about a microsecond): the steps run per bucket
(:func:`_held`, :func:`_bucket_into`, :func:`_append`) are kept small, gathering a
document's members stays in the kernel's loop, and the steps that stay calls either do a
document's real work (counting, verifying) or run only when retention or clocks are on.

The batch's own appends are ``lists`` (:func:`_no_appends`): one linked list per bucket
slot, oldest first, rows ``HEAD``, ``TAIL``, ``COUNT`` by slot and ``DOC``, ``NEXT`` by
entry (one docnum appended to one slot; entries are numbered as the bucket keys).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stream_dedup.core._kernels import intersection_at_least
from stream_dedup.core.jit import kernel


@kernel
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


@kernel
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


@kernel
def _similarity(a: Any, b: Any, exact: bool, threshold: float) -> float:
    """Exact: :func:`similarity_at_least`; signature: the fraction of equal positions."""
    if not exact:
        equal = 0
        for i in range(a.size):
            equal += a[i] == b[i]
        return equal / a.size  # type: ignore[no-any-return]
    return similarity_at_least(a, b, threshold)


@kernel
def _first_held(
    clock: int, limits: Any, cp_doc: Any, cp_clock: Any, pt_doc: Any, pt_clock: Any, n_pts: int,
    next_docnum: int,
) -> int:  # fmt: skip
    """The first docnum still held for a document decided at ``clock``, the next indexed
    document getting ``next_docnum`` (:func:`stream_dedup.index.retention.first_held`;
    ``limits``: window, max_documents, NO_CLOCK), from the committed change points
    (``cp_*``), then the first ``n_pts`` the batch has added (``pt_*``): the batch's own
    documents move the clock, and may expire earlier ones of the batch."""
    window, max_docs, no_clock = limits
    lo = 0
    if window > 0 and clock != no_clock and cp_doc.size + n_pts > 0:
        since = clock - window
        j = np.searchsorted(cp_clock, since)
        if j < cp_doc.size:
            if j > 0:
                lo = cp_doc[j]
        else:
            k = np.searchsorted(pt_clock[:n_pts], since)
            if k < n_pts:
                if cp_doc.size + k > 0:
                    lo = pt_doc[k]
            else:
                lo = next_docnum
    if max_docs > 0:
        lo = max(lo, next_docnum - max_docs)
    return lo


@kernel
def _add_point(
    pt_doc: Any, pt_clock: Any, n_pts: int, num: int, clock: int, cp_clock: Any, opens: bool
) -> int:
    """Record document ``num``, indexed at ``clock``, as a change point if it moves the
    clock on or ``opens`` a new epoch; returns how many points the batch has added.

    Retention needs only the documents where the clock changes to find a cutoff, and each
    epoch's points to start at its first docnum (:mod:`stream_dedup.index.retention`).
    """
    last = clock - 1
    if n_pts > 0:
        last = pt_clock[n_pts - 1]
    elif cp_clock.size > 0:
        last = cp_clock[cp_clock.size - 1]
    if not (clock > last or opens):
        return n_pts
    pt_doc[n_pts] = num
    pt_clock[n_pts] = clock
    return n_pts + 1


#: Rows of ``lists`` (:func:`_no_appends`).
HEAD, TAIL, COUNT, DOC, NEXT = 0, 1, 2, 3, 4


@kernel
def _no_appends(n_keys: int) -> Any:
    """Empty ``lists`` for ``n_keys`` bucket slots, with room for one entry per key.

    Linked lists, not a copy of the bucket per append: an append costs the same however
    full the bucket, and readers walk the committed members, then the list. One array of
    five rows, so that every helper takes the lists as one argument.
    """
    lists = np.empty((5, n_keys), dtype=np.int64)
    lists[HEAD] = -1
    lists[TAIL] = -1
    lists[COUNT] = 0
    return lists


@kernel
def _held(s: int, com_len: Any, lists: Any, max_members: int) -> int:
    """How many members bucket slot ``s`` holds now: the committed ones and the batch's
    appends, at most ``max_members`` once the batch has appended (the index keeps a
    bucket's newest ``max_members``; what it holds already is within the limit)."""
    if lists[COUNT, s] > 0:
        return min(max_members, com_len[s] + lists[COUNT, s])  # type: ignore[no-any-return]
    return com_len[s]  # type: ignore[no-any-return]


@kernel
def _pushed_out(s: int, com_len: Any, lists: Any, max_members: int) -> int:
    """How many of bucket slot ``s``'s oldest members the batch's appends pushed out."""
    return com_len[s] + lists[COUNT, s] - _held(s, com_len, lists, max_members)  # type: ignore[no-any-return]


@kernel
def _bucket_into(out: Any, at: int, skip: int, committed: Any, e: int, lists: Any) -> int:
    """Write a bucket's members, oldest first (``committed``, then the batch's appends from
    entry ``e`` on), less the first ``skip``, to ``out`` from ``at``; returns the position
    after the last one written.

    One reading for a document's candidates and for the index's write. Small on purpose:
    it runs once per bucket of every document, and LLVM inlines it only while it is small.
    """
    for member in committed:
        if skip > 0:
            skip -= 1
        else:
            out[at] = member
            at += 1
    while e >= 0:
        if skip > 0:
            skip -= 1
        else:
            out[at] = lists[DOC, e]
            at += 1
        e = lists[NEXT, e]
    return at


@kernel
def _shared_counts(members: Any, lo: int) -> tuple[Any, Any]:
    """The distinct values of sorted ``members`` from ``lo`` on, and how often each occurs.

    A docnum occurs once per bucket it shares with the document, so the count is the number
    of bands they share, the candidates' rank; members below ``lo`` are expired (no longer
    held) and are no candidates.
    """
    if lo > 0:
        members = members[np.searchsorted(members, lo) :]
    k = members.size
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
    return unique, counts


@kernel
def _best_match(
    qa: Any, chosen: Any, q_flat: Any, q_at: Any, q_len: Any, records: Any, pos_of: Any,
    first: int, exact: bool, threshold: float,
) -> tuple[int, float]:  # fmt: skip
    """The most similar of ``chosen`` to payload ``qa`` at or above the threshold, ties to
    the earliest: (docnum, similarity), or (-1, -1.0) if none.

    A candidate from docnum ``first`` on was indexed by this batch: its payload is one of
    ``q_*``, at live position ``pos_of[docnum - first]``; any other's is in ``records``.
    """
    r_docnums, r_flat, r_at, r_len = records
    found = -1
    best = -1.0
    for j in range(chosen.size):
        d = chosen[j]
        if d >= first:
            o = pos_of[d - first]
            other = q_flat[q_at[o] : q_at[o] + q_len[o]]
        else:
            r = np.searchsorted(r_docnums, d)
            other = r_flat[r_at[r] : r_at[r] + r_len[r]]
        sim = _similarity(qa, other, exact, threshold)
        if sim < threshold:
            continue
        if sim > best or (sim == best and d < found):
            best = sim
            found = d
    return found, best


@kernel
def _append(lists: Any, s: int, e: int, num: int, com_len: Any, max_members: int) -> bool:
    """Append docnum ``num`` to bucket slot ``s``'s list as entry ``e``, where the batch's
    later documents find it; returns whether the bucket was full (it evicts its oldest).

    Small on purpose, like :func:`_bucket_into`: it runs once per bucket of every indexed
    document, and LLVM inlines it only while it is small.
    """
    full = _held(s, com_len, lists, max_members) >= max_members
    lists[DOC, e] = num
    lists[NEXT, e] = -1
    if lists[TAIL, s] >= 0:
        lists[NEXT, lists[TAIL, s]] = e
    else:
        lists[HEAD, s] = e
    lists[TAIL, s] = e
    lists[COUNT, s] += 1
    return full


@kernel
def _final_contents(
    com_at: Any, com_len: Any, com_members: Any, lists: Any, max_members: int
) -> tuple[Any, Any, Any]:
    """The contents the index is to hold for every slot the batch appended to, but a new
    bucket of one member (written from its docnum alone): (contents, at, len) per slot,
    ``len`` 0 for the others."""
    n_keys = com_len.size
    content_at = np.zeros(n_keys, dtype=np.int64)
    content_len = np.zeros(n_keys, dtype=np.int64)
    total_len = 0
    for s in range(n_keys):
        if lists[COUNT, s] > 0 and (com_len[s] > 0 or lists[COUNT, s] > 1):
            content_len[s] = _held(s, com_len, lists, max_members)
            total_len += content_len[s]
    contents = np.empty(total_len, dtype=np.int64)
    w = 0
    for s in range(n_keys):
        if content_len[s] > 0:
            content_at[s] = w
            skip = _pushed_out(s, com_len, lists, max_members)
            committed = com_members[com_at[s] : com_at[s] + com_len[s]]
            w = _bucket_into(contents, w, skip, committed, lists[HEAD, s], lists)
    return contents, content_at, content_len


@kernel
def _match_batch(
    fresh: Any,
    text_group: Any,
    group_docnum: Any,
    slot: Any,
    committed: Any,
    older: Any,
    payloads: Any,
    records: Any,
    expiry: Any,
    points: Any,
    rules: Any,
    first_docnum: int,
) -> tuple[Any, ...]:
    """The pass over the batch; :func:`~stream_dedup.core.match.match_batch` documents the
    arguments and results (``rules``: bands, max_members, max_candidates, threshold, exact,
    index_all; ``expiry``: doc_clock, points_doc, points_clock, window, max_documents,
    NO_CLOCK, new_epoch; ``points``: room for the batch's change points).

    A document's steps in order: its retention cutoff, an exact-text match, else the
    members of its buckets gathered, counted, ranked and verified; then, if it is indexed,
    its docnum, its text, its change point and its bucket appends, which the documents
    after it see. The tuples are unpacked once, here, and the helpers take arrays.
    """
    bands, mm, max_candidates, threshold, exact, index_all = rules
    com_at, com_len, com_members = committed
    old_at, old_len, old_members = older
    q_flat, q_at, q_len = payloads
    doc_clock, cp_doc, cp_clock, window, max_docs, no_clock, new_epoch = expiry
    pt_doc, pt_clock = points
    retains = window > 0 or max_docs > 0
    n = fresh.size
    match = np.full(n, -1, dtype=np.int64)
    similarity = np.zeros(n, dtype=np.float64)
    n_cand = np.zeros(n, dtype=np.int64)
    n_ver = np.zeros(n, dtype=np.int64)
    docnum = np.full(n, -1, dtype=np.int64)
    new_text = np.zeros(n, dtype=np.bool_)
    pos_of = np.empty(n, dtype=np.int64)  # docnum - first_docnum -> live position
    lists = _no_appends(slot.size)
    scratch = np.empty(64, dtype=np.int64)
    exact_hits = truncated = evictions = n_pts = 0
    next_docnum = first_docnum
    for p in range(n):
        if not fresh[p]:
            continue
        lo = 0  # the first docnum still held
        if retains:
            lo = _first_held(doc_clock[p], (window, max_docs, no_clock), cp_doc, cp_clock,
                             pt_doc, pt_clock, n_pts, next_docnum)  # fmt: skip
        g = text_group[p]
        text_held = group_docnum[g] >= lo and group_docnum[g] >= 0
        found, best = -1, -1.0
        size = 0
        if text_held:
            found, best = group_docnum[g], 1.0
            n_cand[p] = 1
            exact_hits += 1
        else:
            for b in range(p * bands, (p + 1) * bands):  # the members of its buckets
                size += _held(slot[b], com_len, lists, mm) + old_len[slot[b]]
        if not text_held and size > 0:
            if size > scratch.size:  # one scratch array serves the whole batch
                scratch = np.empty(2 * size, dtype=np.int64)
            k = 0
            for b in range(p * bands, (p + 1) * bands):
                for i in range(old_at[slot[b]], old_at[slot[b]] + old_len[slot[b]]):
                    scratch[k] = old_members[i]
                    k += 1
                s = slot[b]
                skip = _pushed_out(s, com_len, lists, mm)
                committed = com_members[com_at[s] : com_at[s] + com_len[s]]
                k = _bucket_into(scratch, k, skip, committed, lists[HEAD, s], lists)
            unique, counts = _shared_counts(np.sort(scratch[:k]), lo)
            n_cand[p] = unique.size
            chosen = unique
            if unique.size > max_candidates:  # most shared bands first, ties to the earliest
                truncated += 1
                chosen = unique[np.argsort(-counts, kind="mergesort")[:max_candidates]]
            n_ver[p] = chosen.size
            qa = q_flat[q_at[p] : q_at[p] + q_len[p]]
            found, best = _best_match(qa, chosen, q_flat, q_at, q_len, records, pos_of,
                                      first_docnum, exact, threshold)  # fmt: skip
        if found >= 0:
            match[p] = found
            similarity[p] = best
        if index_all or found < 0:
            num = next_docnum
            next_docnum += 1
            docnum[p] = num
            pos_of[num - first_docnum] = p
            if not text_held:  # no document held has this text
                group_docnum[g] = num
                new_text[p] = True
            if doc_clock[p] != no_clock:
                opens = new_epoch and num == first_docnum
                n_pts = _add_point(pt_doc, pt_clock, n_pts, num, doc_clock[p], cp_clock, opens)
            for e in range(p * bands, (p + 1) * bands):  # entries numbered as the keys
                evictions += _append(lists, slot[e], e, num, com_len, mm)
    contents, content_at, content_len = _final_contents(com_at, com_len, com_members, lists, mm)
    return (
        match, similarity, n_cand, n_ver, docnum, new_text,
        exact_hits, truncated, evictions, contents, content_at, content_len, n_pts,
    )  # fmt: skip
