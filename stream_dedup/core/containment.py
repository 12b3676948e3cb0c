"""Containment: which verification values a document is indexed under for excerpts.

An excerpt D of an earlier document E (most of D's shingles are in E, but E is much
longer) has a low Jaccard with E, so the band buckets, tuned for Jaccard at the
threshold, seldom bring E up. Containment needs candidates of its own. The index uses
*consistent hash sampling*: a verification value v (a shingle hash's high 32 bits, see
:mod:`.verify`) is *sampled* when ``splitmix64(v ^ salt)`` has its low ``log2 rate`` bits
zero. The choice depends on v alone, so every shingle of D that E holds and that is
sampled for D is sampled for E too: D shares about ``C * |D| / rate`` sampled values with
a document that contains a share C of it, and about ``C' * |D| / rate`` with a stranger
that shares C' of its shingles. Counting shared sampled values ranks the containing
document first; the exact containment, computed from the stored text, decides.

A sampled value is stored as a bucket key of the reserved band :data:`SAMPLE_BAND` (the
layout of :mod:`.lookup_keys`, ``b <band u16> <hash u64>``), so every backend, the key
filter, retention and Redis hold it with no machinery of its own. ``docs/containment.md``
has the design and the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream_dedup.core import _containment_kernels, jit
from stream_dedup.core.hashing import U32, U64
from stream_dedup.core.jit import kernel

I64 = npt.NDArray[np.int64]

#: The band number of sampled-value keys: above any band a signature can have (K <= 4096).
SAMPLE_BAND = 0xFFFF
#: Multiplies each value before sampling (Knuth's multiplicative hash): the sample is
#: then decided by bits of the product that mix all of the value's bits, not by the high
#: bits that also choose the value's signature bin.
_GOLDEN = np.uint32(0x9E3779B1)


def _keep(values: U32, rate: int, seed: int) -> npt.NDArray[np.bool_]:
    """Which values are sampled at 1/``rate`` (a power of two) for ``seed``."""
    shift = np.uint32(32 - (rate.bit_length() - 1))
    salted = values ^ np.uint32((seed * 0x85EBCA6B) & 0xFFFFFFFF)
    keep: npt.NDArray[np.bool_] = ((salted * _GOLDEN) >> shift) == 0
    return keep


def sampled(values: U32, rate: int, seed: int) -> U64:
    """The values of one verification set that are sampled at 1/``rate`` (a power of
    two), as the 64-bit band hashes of their keys, in the set's (ascending) order."""
    picked: U64 = values[_keep(values.astype(np.uint32), rate, seed)].astype(np.uint64)
    return picked


#: Sampling rate (1 value in :data:`SAMPLE_RATE`) and the members a sampled bucket holds
#: before its value counts as common: stored in the index with the containment setting
#: (they decide which keys it holds). Measured in ``docs/containment.md``.
SAMPLE_RATE = 16
SAMPLE_CAP = 64
#: Shared sampled values that make an earlier document a candidate.
MIN_VOTES = 2
#: Candidates verified per document whatever their votes (most votes first): a document
#: that the new one contains shares few of the new one's values, yet is most often among
#: the first few.
ALWAYS = 3
#: The votes one of those first :data:`ALWAYS` needs when it is below the floor of
#: :data:`SIGMAS`: pairs sharing 2 or 3 sampled values were a container or a contained
#: document 12 times in 8,678 verifications on the news benchmark, and changed 2 verdicts
#: of 10,000 (``docs/containment.md``), for half of the verifications.
ALWAYS_VOTES = 4
#: Standard deviations below its expected votes that a container is still verified: a
#: document holding a share ``c`` of D's shingles shares about ``Binomial(s, c)`` of
#: D's ``s`` voting values, so one at the containment setting falls below this many
#: standard deviations less than 0.2 % of the time (``docs/containment.md``): the floor is
#: ``max(MIN_VOTES, floor(c·s − SIGMAS·sqrt(s·c·(1 − c))))``.
SIGMAS = 3.0


def sample_keys(
    flat: U32,
    at: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
    rate: int,
    seed: int,
    skip: U64 | None = None,
) -> tuple[npt.NDArray[np.int64], U64]:
    """The sampled values of a batch's verification sets (set ``p`` at ``flat[at[p]:][:
    length[p]]``, one after another), as ``(position, value)`` arrays in set order:
    :func:`_keep`'s rule, in one compiled pass where the batch runs compiled
    (:func:`._containment_kernels.sample_flat`), else in numpy's passes. Values in
    ``skip`` (sorted) are left out, in the same pass: see :func:`sample_unknown`."""
    return sample_unknown(flat, at, length, rate, seed, skip)[:2]


def sample_unknown(
    flat: U32,
    at: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
    rate: int,
    seed: int,
    skip: U64 | None,
) -> tuple[npt.NDArray[np.int64], U64, int]:
    """:func:`sample_keys`, and how many sampled occurrences ``skip`` left out.

    Most of a grown stream's sampled occurrences are of values known to be in full
    buckets (``dedup/full_buckets.py``): leaving them out as they are sampled spares the
    arrays of every occurrence and a search of each against them after (~2 µs per
    document on news)."""
    skip = np.empty(0, dtype=np.uint64) if skip is None else skip
    if not jit.runs_compiled(documents=at.size, items=flat.size // 64):
        keep = np.flatnonzero(_keep(flat.astype(np.uint32, copy=False), rate, seed))
        owner = np.searchsorted(np.cumsum(length), keep, side="right").astype(np.int64)
        values = flat[keep].astype(np.uint64)
        if not skip.size:
            return owner, values, 0
        where = np.minimum(np.searchsorted(skip, values), skip.size - 1)
        unknown = skip[where] != values
        return owner[unknown], values[unknown], int(values.size - np.count_nonzero(unknown))
    pos = np.empty(flat.size, dtype=np.int64)
    values = np.empty(flat.size, dtype=np.uint64)
    salt = np.uint64((seed * 0x85EBCA6B) & 0xFFFFFFFF)
    below = np.uint64(1 << (32 - (rate.bit_length() - 1)))
    skipped = np.zeros(1, dtype=np.int64)
    n = jit.compiled(_containment_kernels.sample_flat)(
        flat, at, length, salt, below, skip, pos, values, skipped
    )
    return pos[:n], values[:n], int(skipped[0])


def spans(starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorised."""
    total = int(lengths.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    steps = np.ones(total, dtype=np.int64)
    nonzero = lengths > 0
    first = (ends - lengths)[nonzero]
    steps[0] = starts[nonzero][0]
    prev_end = (starts + lengths - 1)[nonzero][:-1]
    steps[first[1:]] = starts[nonzero][1:] - prev_end
    return np.cumsum(steps)


@dataclass(frozen=True, slots=True)
class SampledBuckets:
    """What the index holds under a batch's distinct sampled keys (one entry per key).

    ``held_at``/``held_len``/``held`` are each key's live members (every live epoch,
    expired ones left out), ``mine_len`` how many of them the bucket of the epoch the
    batch writes to holds: that bucket grows to :data:`SAMPLE_CAP` members, then stops.
    """

    held_at: npt.NDArray[np.int64]
    held_len: npt.NDArray[np.int64]
    held: npt.NDArray[np.int64]
    mine_len: npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Votes:
    """Candidates per document and the sampled buckets' growth.

    ``pos``/``docnum``/``votes``: each (document position, earlier docnum) pair with at
    least :data:`MIN_VOTES` shared sampled values, at most ``limit`` per position, most
    votes first (ties: the earliest docnum). ``appended``: per occurrence (in ``key``
    order of the input), whether its document joins that key's bucket.
    """

    pos: npt.NDArray[np.int64]
    docnum: npt.NDArray[np.int64]
    votes: npt.NDArray[np.int64]
    appended: npt.NDArray[np.bool_]


def vote(
    occ_pos: npt.NDArray[np.int64],
    occ_key: npt.NDArray[np.int64],
    buckets: SampledBuckets,
    docnum: npt.NDArray[np.int64],
    voting: npt.NDArray[np.bool_],
    cap: int,
    limit: int,
    level: float,
) -> Votes:
    """Count, for each voting document, the earlier documents sharing its sampled values.

    ``occ_pos``/``occ_key``: each sampled value of the batch as (live position, distinct
    key number); ``docnum`` each position's docnum (-1: not indexed), ``voting`` whether
    it looks for a container. Documents are taken in batch order, as if one by one: a
    bucket holding ``cap`` members (held, or added earlier in the batch) is common and
    does not vote, and its epoch's bucket takes no more members. A candidate is kept
    among the first :data:`ALWAYS` by votes with at least :data:`ALWAYS_VOTES`, or with at
    least the floor of :data:`SIGMAS` for containment ``level``; at most ``limit`` per
    document. One compiled pass over the
    batch (:mod:`._containment_kernels`), the occurrences taken in batch order.
    """
    if occ_pos.size > 1 and (occ_pos[1:] < occ_pos[:-1]).any():
        order = np.argsort(occ_pos, kind="stable")  # batch order, as the vote runs
        votes = vote(occ_pos[order], occ_key[order], buckets, docnum, voting, cap, limit, level)
        back = np.empty(order.size, dtype=bool)
        back[order] = votes.appended
        return Votes(votes.pos, votes.docnum, votes.votes, back)
    appended = np.empty(occ_pos.size, dtype=bool)
    most = int(np.count_nonzero(voting)) * limit
    out = [np.empty(most, dtype=np.int64) for _ in range(3)]
    run = jit.choose(_containment_kernels.count_votes, items=occ_pos.size)
    n = run(
        occ_pos, occ_key, docnum[occ_pos], voting[occ_pos],
        buckets.held_at, buckets.held_len, buckets.held, buckets.mine_len,
        cap, limit, ALWAYS, ALWAYS_VOTES, MIN_VOTES, level, SIGMAS, appended, *out,
    )  # fmt: skip
    return Votes(out[0][:n], out[1][:n], out[2][:n], appended)


#: Merge steps between two checks of whether a pair can still reach its need.
_STRIDE = 64


@kernel
def intersections(
    a_flat: U32, a_at: I64, a_len: I64, b_flat: U32, b_at: I64, b_len: I64, need: I64, out: I64
) -> None:
    """``out[i] = |A_i ∩ B_i|`` for pairs of sorted sets of distinct values (a merge),
    given up once it cannot reach ``need[i]`` (then some count below it).

    The merge steps without branches (each step adds the comparisons' outcomes), which
    the hashed values, in random order, would mispredict half the time; the bound is
    checked every :data:`_STRIDE` steps, which no step can overrun: each advances either
    side by at most one.
    """
    for i in range(out.size):
        x, x_end = a_at[i], a_at[i] + a_len[i]
        y, y_end = b_at[i], b_at[i] + b_len[i]
        n = 0
        while True:
            left = min(x_end - x, y_end - y)
            if left <= 0 or n + left < need[i]:
                break
            for _ in range(min(left, _STRIDE)):
                u, w = a_flat[x], b_flat[y]
                n += u == w
                x += u <= w
                y += w <= u
        out[i] = n


def pair_intersections(
    a_flat: U32, a_at: I64, a_len: I64, b_flat: U32, b_at: I64, b_len: I64, need: I64 | None = None
) -> I64:
    """:func:`intersections`, compiled when the work repays loading numba (``need``:
    none by default, every count exact)."""
    out = np.zeros(a_at.size, dtype=np.int64)
    if need is None:
        need = np.zeros(a_at.size, dtype=np.int64)
    if out.size:
        run = jit.choose(intersections, items=int(a_len.sum() + b_len.sum()))
        run(a_flat, a_at, a_len, b_flat, b_at, b_len, need, out)
    return out


def load_kernels() -> None:
    """Run containment's kernels once on a tiny input, in the form :func:`jit.choose`
    picks (compiled under ``jit.forced(True)``): the warm-up's near-duplicate pair
    verifies no excerpt, so it would not load them."""
    one = np.ones(1, dtype=np.int64)
    values = np.ones(1, dtype=np.uint32)
    pair_intersections(values, one - 1, one, values, one - 1, one)
    buckets = SampledBuckets(one - 1, one, one, one)
    vote(one - 1, one - 1, buckets, one, np.ones(1, dtype=bool), SAMPLE_CAP, 1, 0.8)
