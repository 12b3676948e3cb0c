"""Compiled code of the matching pass (numba): the kernel and the steps it is cut into.

:func:`stream_dedup.core.match.match_batch` describes the pass, its arguments and its
results. :func:`_match_batch` walks the batch's live documents in order and calls one
helper per step; numba compiles the helpers into it, so the steps cost no calls at run
time. They sit in the kernel's module because numba's on-disk cache checks only the source
file of the function it caches: a helper elsewhere could change unseen by the cached kernel.

Shapes the helpers share (``int64`` arrays unless said otherwise): ``committed = (at,
len, members)``, and ``older`` alike, per bucket slot ``s`` the members
``members[at[s] : at[s] + len[s]]`` the index holds; ``appends = (head, tail, count, doc,
next)``, the batch's own appends as one linked list per slot, oldest first (``doc`` and
``next`` per entry: one docnum appended to one slot); ``payloads = (flat, at, len)``, the
live documents' verification payloads (``flat`` is ``uint32``), and ``records = (docnums,
flat, at, len)`` the committed documents', by docnum.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from stream_dedup.core._kernels import intersection_at_least

_JIT: dict[str, Any] = {"nogil": True, "cache": True, "boundscheck": False}


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
def _first_held(clock: int, expiry: Any, points: Any, n_pts: int, next_docnum: int) -> int:
    """The first docnum still held for a document decided at ``clock``, the next indexed
    document getting ``next_docnum`` (:func:`stream_dedup.index.retention.first_held`),
    from the committed change points, then the first ``n_pts`` of ``points``: the batch's
    own documents move the clock, and may expire earlier ones of the batch."""
    _, cp_doc, cp_clock, window, max_docs, no_clock, _ = expiry
    pt_doc, pt_clock = points
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


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _add_point(
    points: Any, n_pts: int, num: int, clock: int, cp_clock: Any, no_clock: int, opens: bool
) -> int:
    """Record document ``num``, indexed at ``clock``, as a change point if it moves the
    clock on or ``opens`` a new epoch; returns how many points the batch has added.

    Retention needs only the documents where the clock changes to find a cutoff, and each
    epoch's points to start at its first docnum (:mod:`stream_dedup.index.retention`).
    """
    pt_doc, pt_clock = points
    last = clock - 1
    if n_pts > 0:
        last = pt_clock[n_pts - 1]
    elif cp_clock.size > 0:
        last = cp_clock[cp_clock.size - 1]
    if clock == no_clock or not (clock > last or opens):
        return n_pts
    pt_doc[n_pts] = num
    pt_clock[n_pts] = clock
    return n_pts + 1


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _no_appends(n_keys: int) -> tuple[Any, Any, Any, Any, Any]:
    """Empty ``appends`` for ``n_keys`` bucket slots, with room for one entry per key.

    Linked lists, not a copy of the bucket per append: an append costs the same however
    full the bucket, and readers walk the committed members, then the list.
    """
    head = np.full(n_keys, -1, dtype=np.int64)
    tail = np.full(n_keys, -1, dtype=np.int64)
    count = np.zeros(n_keys, dtype=np.int64)
    return head, tail, count, np.empty(n_keys, dtype=np.int64), np.empty(n_keys, dtype=np.int64)


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _held(s: int, com_len: Any, count: Any, max_members: int) -> int:
    """How many members bucket slot ``s`` holds now: the committed ones and the batch's
    appends, at most ``max_members`` once the batch has appended (the index keeps a
    bucket's newest ``max_members``; what it holds already is within the limit)."""
    if count[s] > 0:
        return min(max_members, com_len[s] + count[s])  # type: ignore[no-any-return]
    return com_len[s]  # type: ignore[no-any-return]


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _bucket_into(out: Any, at: int, s: int, committed: Any, appends: Any, max_members: int) -> int:
    """Write bucket slot ``s``'s members as they are now, oldest first, to ``out`` from
    ``at``; returns the position after the last one written.

    The committed members, then the batch's appends, less the oldest the appends pushed
    out (:func:`_held`): one reading for a document's candidates and for the index's write.
    """
    com_at, com_len, com_members = committed
    head, _, count, app_doc, app_next = appends
    skip = com_len[s] + count[s] - _held(s, com_len, count, max_members)
    for i in range(com_at[s], com_at[s] + com_len[s]):
        if skip > 0:
            skip -= 1
        else:
            out[at] = com_members[i]
            at += 1
    e = head[s]
    while e >= 0:
        if skip > 0:
            skip -= 1
        else:
            out[at] = app_doc[e]
            at += 1
        e = app_next[e]
    return at


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _gather(
    keys: Any, scratch: Any, committed: Any, older: Any, appends: Any, max_members: int
) -> tuple[Any, int]:
    """Every member of the bucket slots ``keys`` (one document's buckets, older epochs'
    members first), a docnum once per bucket it is in, into ``scratch``; returns it (a new,
    larger one if it was too small: one serves the whole batch) and how many were written.
    """
    old_at, old_len, old_members = older
    size = 0
    for s in keys:
        size += _held(s, committed[1], appends[2], max_members) + old_len[s]
    if size > scratch.size:
        scratch = np.empty(2 * size, dtype=np.int64)
    k = 0
    for s in keys:
        for i in range(old_at[s], old_at[s] + old_len[s]):
            scratch[k] = old_members[i]
            k += 1
        k = _bucket_into(scratch, k, s, committed, appends, max_members)
    return scratch, k


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
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


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _ranked(unique: Any, counts: Any, max_candidates: int) -> Any:
    """The candidates to verify: all, or if there are more than ``max_candidates``, the
    ``max_candidates`` sharing the most bands, ties to the earliest (a stable sort on docnum
    order), so a document in crowded buckets costs a bounded number of verifications."""
    if unique.size <= max_candidates:
        return unique
    order = np.argsort(-counts, kind="mergesort")[:max_candidates]
    return unique[order]


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _best_match(
    p: int, chosen: Any, payloads: Any, records: Any, pos_of: Any, first: int, rules: Any
) -> tuple[int, float]:
    """Live document ``p``'s most similar candidate of ``chosen`` at or above the
    threshold, ties to the earliest: (docnum, similarity), or (-1, -1.0) if none.

    A candidate from docnum ``first`` on was indexed by this batch: its payload is at its
    live position, ``pos_of[docnum - first]``; any other's is in ``records``.
    """
    q_flat, q_at, q_len = payloads
    r_docnums, r_flat, r_at, r_len = records
    _, _, _, threshold, exact, _ = rules
    qa = q_flat[q_at[p] : q_at[p] + q_len[p]]
    found = -1
    best = -1.0
    for d in chosen:
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


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _append(keys: Any, num: int, first_entry: int, com_len: Any, appends: Any, mm: int) -> int:
    """Append docnum ``num`` to the bucket slots ``keys`` (entries from ``first_entry``
    on), where the batch's later documents find it; returns how many of those buckets were
    full, each of which evicts its oldest member.
    """
    head, tail, count, app_doc, app_next = appends
    evictions = 0
    for b in range(keys.size):
        s = keys[b]
        e = first_entry + b
        evictions += _held(s, com_len, count, mm) >= mm
        app_doc[e] = num
        app_next[e] = -1
        if tail[s] >= 0:
            app_next[tail[s]] = e
        else:
            head[s] = e
        tail[s] = e
        count[s] += 1
    return evictions


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _final_contents(committed: Any, appends: Any, max_members: int) -> tuple[Any, Any, Any]:
    """The contents the index is to hold for every slot the batch appended to, but a new
    bucket of one member (written from its docnum alone): (contents, at, len) per slot,
    ``len`` 0 for the others."""
    com_len = committed[1]
    count = appends[2]
    n_keys = count.size
    content_at = np.zeros(n_keys, dtype=np.int64)
    content_len = np.zeros(n_keys, dtype=np.int64)
    total_len = 0
    for s in range(n_keys):
        if count[s] > 0 and (com_len[s] > 0 or count[s] > 1):
            content_len[s] = _held(s, com_len, count, max_members)
            total_len += content_len[s]
    contents = np.empty(total_len, dtype=np.int64)
    w = 0
    for s in range(n_keys):
        if content_len[s] > 0:
            content_at[s] = w
            w = _bucket_into(contents, w, s, committed, appends, max_members)
    return contents, content_at, content_len


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
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
    members of its buckets ranked and verified; then, if it is indexed, its docnum, its
    text, its change point and its bucket appends, which the documents after it see.
    """
    bands, max_members, max_candidates, _, _, index_all = rules
    doc_clock, _, cp_clock, _, _, no_clock, new_epoch = expiry
    n = fresh.size
    match = np.full(n, -1, dtype=np.int64)
    similarity = np.zeros(n, dtype=np.float64)
    n_cand = np.zeros(n, dtype=np.int64)
    n_ver = np.zeros(n, dtype=np.int64)
    docnum = np.full(n, -1, dtype=np.int64)
    new_text = np.zeros(n, dtype=np.bool_)
    pos_of = np.empty(n, dtype=np.int64)  # docnum - first_docnum -> live position
    appends = _no_appends(slot.size)
    scratch = np.empty(64, dtype=np.int64)
    exact_hits = truncated = evictions = n_pts = 0
    next_docnum = first_docnum
    for p in range(n):
        if not fresh[p]:
            continue
        keys = slot[p * bands : (p + 1) * bands]
        lo = _first_held(doc_clock[p], expiry, points, n_pts, next_docnum)
        g = text_group[p]
        text_held = group_docnum[g] >= lo and group_docnum[g] >= 0
        found, best = -1, -1.0
        if text_held:
            found, best = group_docnum[g], 1.0
            n_cand[p] = 1
            exact_hits += 1
        else:
            scratch, k = _gather(keys, scratch, committed, older, appends, max_members)
            if k > 0:
                unique, counts = _shared_counts(np.sort(scratch[:k]), lo)
                chosen = _ranked(unique, counts, max_candidates)
                truncated += chosen.size < unique.size
                n_cand[p] = unique.size
                n_ver[p] = chosen.size
                found, best = _best_match(p, chosen, payloads, records, pos_of, first_docnum, rules)
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
            opens = new_epoch and num == first_docnum
            n_pts = _add_point(points, n_pts, num, doc_clock[p], cp_clock, no_clock, opens)
            entry = (num - first_docnum) * bands  # each indexed document appends `bands`
            evictions += _append(keys, num, entry, committed[1], appends, max_members)
    contents, content_at, content_len = _final_contents(committed, appends, max_members)
    return (
        match, similarity, n_cand, n_ver, docnum, new_text,
        exact_hits, truncated, evictions, contents, content_at, content_len, n_pts,
    )  # fmt: skip
