"""The vote of containment's candidates as one pass over a batch (see
:func:`stream_dedup.core.containment.vote`, which states the rule).

Counting every (document, member) pair of the voting buckets with ``np.unique`` sorted
them all: ~150,000 pairs per batch of 1,000 news articles, most of them single votes that
are thrown away, plus two ``lexsort`` passes to put the occurrences and the candidates in
order. Here each document's pairs go into a small open-addressing table (cleared slot by
slot after the document), so the cost is one step per pair, and only the pairs with at
least two votes are sorted, per document.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from stream_dedup.core.jit import kernel

I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
B = npt.NDArray[np.bool_]
#: Sampling's multiplier (:data:`stream_dedup.core.containment._GOLDEN`) and the mask that
#: keeps a 64-bit product to its low 32 bits, as numba's unsigned types want them.
_GOLDEN = np.uint64(0x9E3779B1)
_LOW32 = np.uint64(0xFFFFFFFF)


@kernel
def _ranks(occ_key: I64, occ_doc: I64, n_keys: int, rank: I64) -> tuple[I64, I64]:
    """``rank[i]``: the indexed occurrences of occurrence ``i``'s key before it (the
    occurrences are in batch order); returns each key's indexed docnums in batch order,
    as ``(start, docnums)`` (key ``k``'s at ``docnums[start[k]:start[k + 1]]``)."""
    start = np.zeros(n_keys + 1, dtype=np.int64)
    for i in range(occ_key.size):
        if occ_doc[i] >= 0:
            start[occ_key[i] + 1] += 1
    for k in range(n_keys):
        start[k + 1] += start[k]
    fill = start[:-1].copy()
    docnums = np.empty(start[n_keys], dtype=np.int64)
    for i in range(occ_key.size):
        k = occ_key[i]
        rank[i] = fill[k] - start[k]
        if occ_doc[i] >= 0:
            docnums[fill[k]] = occ_doc[i]
            fill[k] += 1
    return start, docnums


@kernel
def _flag_appends(
    occ_pos: I64,
    occ_key: I64,
    occ_doc: I64,
    occ_voting: B,
    held_len: I64,
    mine_len: I64,
    rank: I64,
    cap: int,
    appended: B,
) -> int:
    """Fill ``appended`` (an indexed occurrence whose bucket still has room in this
    process's view); return the most members one document's voting buckets hold, which
    sizes the vote's table."""
    most = 0
    i = 0
    while i < occ_pos.size:
        j, m = i, 0
        while j < occ_pos.size and occ_pos[j] == occ_pos[i]:
            k = occ_key[j]
            appended[j] = occ_doc[j] >= 0 and mine_len[k] + rank[j] < cap
            if occ_voting[j] and held_len[k] + rank[j] < cap:
                m += held_len[k] + rank[j]
            j += 1
        most = max(most, m)
        i = j
    return most


@kernel
def _tally(
    lo: int,
    hi: int,
    occ_key: I64,
    rank: I64,
    held_at: I64,
    held_len: I64,
    held: I64,
    b_start: I64,
    b_doc: I64,
    cap: int,
    slot_doc: I64,
    slot_n: I64,
    used: I64,
) -> tuple[int, int]:
    """One document's votes (its occurrences ``lo:hi``): each member of each of its
    buckets not full, held then the batch's earlier ones, counted in the open-addressing
    table ``slot_doc``/``slot_n``; ``used`` lists the slots taken. Returns how many slots
    and how many buckets voted."""
    size = slot_doc.size
    n_used, voters = 0, 0
    for o in range(lo, hi):
        k = occ_key[o]
        if held_len[k] + rank[o] >= cap:
            continue
        voters += 1
        n_held, at_held, at_batch = held_len[k], held_at[k], b_start[k] - held_len[k]
        for t in range(n_held + rank[o]):  # the held members, then the batch's
            d = held[at_held + t] if t < n_held else b_doc[at_batch + t]
            h = (d * 0x9E3779B1) & (size - 1)
            while slot_doc[h] != -1 and slot_doc[h] != d:
                h = (h + 1) & (size - 1)
            if slot_doc[h] == -1:
                slot_doc[h] = d
                used[n_used] = h
                n_used += 1
            slot_n[h] += 1
    return n_used, voters


@kernel
def _ranked(slot_doc: I64, slot_n: I64, used: I64, n_used: int, min_votes: int) -> I64:
    """The documents with at least ``min_votes`` votes, most votes first then the
    earliest, as one sorted key each (``(2**22 - votes) << 40 | docnum``); clears the
    table's used slots for the next document."""
    n_c = 0
    for u in range(n_used):
        if slot_n[used[u]] >= min_votes:
            n_c += 1
    order = np.empty(n_c, dtype=np.int64)
    n_c = 0
    for u in range(n_used):
        h = used[u]
        if slot_n[h] >= min_votes:
            order[n_c] = ((1 << 22) - slot_n[h]) << 40 | slot_doc[h]
            n_c += 1
        slot_doc[h] = -1
        slot_n[h] = 0
    order.sort()
    return order


@kernel
def count_votes(
    occ_pos: I64,
    occ_key: I64,
    occ_doc: I64,
    occ_voting: B,
    held_at: I64,
    held_len: I64,
    held: I64,
    mine_len: I64,
    cap: int,
    limit: int,
    always: int,
    always_votes: int,
    min_votes: int,
    level: float,
    sigmas: float,
    appended: B,
    out_pos: I64,
    out_doc: I64,
    out_votes: I64,
) -> int:
    """The vote over a batch's sampled occurrences (in batch order: ``occ_pos``
    ascending), each with its key, its document's docnum (-1: not indexed) and whether
    that document votes. Fills ``appended`` per occurrence and the candidates, by position
    then most votes then earliest docnum, into ``out_*``; returns how many there are."""
    rank = np.empty(occ_pos.size, dtype=np.int64)
    b_start, b_doc = _ranks(occ_key, occ_doc, held_len.size, rank)
    most = _flag_appends(occ_pos, occ_key, occ_doc, occ_voting, held_len, mine_len, rank, cap,
                         appended)  # fmt: skip
    size = 16
    while size < 2 * most:
        size *= 2
    slot_doc = np.full(size, -1, dtype=np.int64)
    slot_n = np.zeros(size, dtype=np.int64)
    used = np.empty(max(most, 1), dtype=np.int64)
    n_out = 0
    i = 0
    while i < occ_pos.size:
        j = i
        while j < occ_pos.size and occ_pos[j] == occ_pos[i]:
            j += 1
        if not occ_voting[i]:
            i = j
            continue
        n_used, voters = _tally(i, j, occ_key, rank, held_at, held_len, held, b_start, b_doc,
                                cap, slot_doc, slot_n, used)  # fmt: skip
        mean = level * voters
        spread = sigmas * math.sqrt(voters * level * (1.0 - level))
        floor = max(min_votes, math.floor(mean - spread))
        order = _ranked(slot_doc, slot_n, used, n_used, min_votes)
        for at in range(min(order.size, limit)):
            votes = (1 << 22) - (order[at] >> 40)
            if (at < always and votes >= always_votes) or votes >= floor:
                out_pos[n_out] = occ_pos[i]
                out_doc[n_out] = order[at] & ((1 << 40) - 1)
                out_votes[n_out] = votes
                n_out += 1
        i = j
    return n_out


@kernel
def sample_flat(
    flat: U32,
    at: I64,
    length: I64,
    salt: np.uint64,
    below: np.uint64,
    skip: U64,
    pos: I64,
    values: U64,
    skipped: I64,
) -> int:
    """The sampled values of sets ``flat[at[p]:][:length[p]]`` (see
    :func:`stream_dedup.core.containment.sample_keys`, whose rule this is: the top bits of
    ``(v ^ salt) * 0x9E3779B1 mod 2^32`` zero, that is the product ``< below``) into
    ``pos``/``values``, leaving out those in ``skip`` (sorted, counted in
    ``skipped[0]``); returns how many were kept. One pass instead of numpy's five over
    every value of the batch, in unsigned 64-bit arithmetic only (numba turns a
    comparison of unsigned and signed integers into one of floats)."""
    n = 0
    n_skip = skip.size
    for p in range(at.size):
        for i in range(at[p], at[p] + length[p]):
            v = np.uint64(flat[i])
            if ((v ^ salt) * _GOLDEN) & _LOW32 < below:
                if n_skip:
                    k = np.searchsorted(skip, v)
                    if k < n_skip and skip[k] == v:
                        skipped[0] += 1
                        continue
                pos[n] = p
                values[n] = v
                n += 1
    return n
