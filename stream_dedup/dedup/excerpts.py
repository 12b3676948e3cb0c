"""Containment over an index: excerpts of earlier documents, found and verified exactly.

Runs after the matching pass, on the documents it found no near-duplicate for (a
near-duplicate keeps precedence). Each such document's sampled values
(:mod:`stream_dedup.core.containment`) are looked up as bucket keys of the reserved band;
the earlier documents sharing at least two of them, most shared first, are verified
against their stored texts (sets rebuilt as verification rebuilds them,
:func:`~.reads.payloads`): ``|D ∩ X| / |D|`` is D's containment in X. The document with
the highest containment at or above the setting (ties: the earliest) becomes D's match,
as an ``excerpt``, or as a ``near-duplicate`` when its Jaccard reaches the threshold (a
pair the bands missed). A unique document that holds at least that share of an earlier
one names it in ``contains``. Every indexed document joins the buckets of its sampled
values, which the batch's commit writes with the band buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.containment import (
    SAMPLE_BAND,
    SampledBuckets,
    pair_intersections,
    sample_unknown,
    spans,
    vote,
)
from stream_dedup.core.hashing import U32
from stream_dedup.core.lookup_keys import band_bucket_keys
from stream_dedup.core.match import I64, Matches
from stream_dedup.core.set_cache import SetCache
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup.full_buckets import FullBuckets
from stream_dedup.dedup.reads import Held, joined, payload_arrays
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.bucket_records import Members
from stream_dedup.index.store import DedupIndex
from stream_dedup.models import Document, Relation

#: Candidates verified per document: those with the most shared sampled values.
VERIFIED = 20


@dataclass(slots=True)
class Relations:
    """Per live position of the batch: its relation to its match and its containment
    there, and the earlier document it contains (id, share); the sampled buckets the
    batch's commit writes (key order) and their keys' fingerprints."""

    relation: dict[int, tuple[str, float]] = field(default_factory=dict)
    contains: dict[int, tuple[str, float]] = field(default_factory=dict)
    excerpts: int = 0
    puts: OrderedPuts = NO_ORDERED_PUTS
    fingerprints: npt.NDArray[np.uint64] = field(
        default_factory=lambda: np.empty(0, dtype=np.uint64)
    )


def find_excerpts(
    index: DedupIndex,
    config: DedupConfig,
    docs: Sequence[Document],
    sk: Sketch,
    fresh: npt.NDArray[np.bool_],
    held: Held,
    found: Matches,
    epoch: int,
    cache: SetCache,
    full: FullBuckets | None = None,
) -> Relations:
    """Containment for a decided batch: changes ``found`` (an excerpt's match and
    similarity), adds the records it names to ``held.records``, and returns the relations
    and the sampled buckets' writes (see the module docstring). ``full``: the values known
    to be in full buckets, left unread (and kept up to date)."""
    params = index.params
    out = Relations()
    cutoff = index.cutoff()
    # Values known full are left out as they are sampled: most occurrences go there.
    skip = None if full is None else full.current(epoch, cutoff)
    occ_pos, values, unread = sample_unknown(
        sk.set_flat, sk.set_at, sk.set_len, params.containment_rate, config.seed, skip
    )
    if full is not None:
        full.left_unread += unread
    uniq, occ_key = np.unique(values, return_inverse=True)
    keys, fps = band_bucket_keys(SAMPLE_BAND, uniq)
    mine, older = index.read_sampled_members(keys, fps, epoch)
    if full is not None:
        full.learn(uniq, mine)
    buckets = held_buckets(mine, older, cutoff)
    voting = fresh & (found.match < 0) & (found.docnum >= 0)
    votes = vote(
        occ_pos, occ_key.astype(np.int64), buckets, found.docnum, voting,
        params.containment_cap, VERIFIED, config.containment,
    )  # fmt: skip
    level = np.full(votes.pos.size, config.containment)
    inter, q_len, x_len = _verify(index, sk, found, held, votes.pos, votes.docnum, level, cache)
    # A near-duplicate's overlap follows from its exact Jaccard and the two sizes: its
    # pair is not merged again.
    dup = np.flatnonzero(fresh & (found.match >= 0))
    j = found.similarity[dup]
    d_q = sk.set_len[dup].astype(np.float64)
    d_x = _set_sizes(index.counter("indexed"), sk, found, held, found.match[dup], cache)
    inter = np.concatenate([inter, np.round(j * (d_q + d_x) / (1.0 + j))])
    q_len, x_len = np.concatenate([q_len, d_q]), np.concatenate([x_len, d_x])
    n_votes = votes.pos.size
    with np.errstate(divide="ignore", invalid="ignore"):
        contained = np.where(q_len > 0, inter / q_len, 0.0)
        reverse = np.where(x_len > 0, inter / x_len, 0.0)
        jaccard = inter / (q_len + x_len - inter)
    _read_named(
        index, held, index.counter("indexed"), votes.docnum,
        contained[:n_votes], reverse[:n_votes], config.containment,
    )  # fmt: skip
    names = _names(docs, sk, found, held)
    for p, c in zip(dup.tolist(), contained[n_votes:].tolist(), strict=True):
        out.relation[p] = (Relation.NEAR_DUPLICATE, round(c, 6))
    _choose(out, found, config, votes.pos, votes.docnum, contained, reverse, jaccard, names)
    out.puts, out.fingerprints = _bucket_puts(
        keys, fps, occ_key, occ_pos, votes.appended, mine, found.docnum
    )
    return out


def held_buckets(mine: Members, older: Members | None, cutoff: int) -> SampledBuckets:
    """Each key's live members, every live epoch joined (see :class:`SampledBuckets`)."""
    m_at, m_len, m_members = mine
    n = m_len.size
    key_of = [np.repeat(np.arange(n, dtype=np.int64), m_len)]
    members = [m_members[spans(m_at, m_len)].astype(np.int64)]
    if older is not None:
        o_at, o_len, o_members = older
        key_of.append(np.repeat(np.arange(n, dtype=np.int64), o_len))
        members.append(o_members[spans(o_at, o_len)].astype(np.int64))
    keys, held = np.concatenate(key_of), np.concatenate(members)
    live = held >= cutoff
    keys, held = keys[live], held[live]
    order = np.argsort(keys, kind="stable")
    held = held[order]
    held_len = np.bincount(keys, minlength=n).astype(np.int64)
    return SampledBuckets(np.cumsum(held_len) - held_len, held_len, held, m_len.astype(np.int64))


def _verify(
    index: DedupIndex,
    sk: Sketch,
    found: Matches,
    held: Held,
    pos: I64,
    other: I64,
    level: npt.NDArray[np.float64],
    cache: SetCache,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``|D ∩ X|``, ``|D|`` and ``|X|`` of each (position, docnum) pair: exact where
    either containment reaches the pair's ``level``, some count that shows neither does
    otherwise (verification gives up on a pair that cannot reach it)."""
    first = index.counter("indexed")
    in_batch = other >= first
    stored = np.unique(other[~in_batch])
    x_source, x_flats, x_at, x_len = _stored_sets(index, stored.tolist(), held, cache)
    b_at, b_len = np.empty_like(other), np.empty_like(other)
    # Each pair's candidate set lies in one of the stored sets' arrays, or in the batch's
    # own (q_flat, last): each array is merged against in place, with no copy.
    b_source = np.full(other.size, len(x_flats), dtype=np.int64)
    outside = np.flatnonzero(~in_batch)
    where = np.searchsorted(stored, other[outside])
    b_at[outside], b_len[outside] = x_at[where], x_len[where]
    b_source[outside] = x_source[where]
    inside = np.flatnonzero(in_batch)
    p_x = _batch_positions(found, first, other[inside]) if inside.size else inside
    b_at[inside], b_len[inside] = sk.set_at[p_x], sk.set_len[p_x]
    q_flat, q_at, q_len = sk.set_flat, sk.set_at[pos], sk.set_len[pos]
    need = np.ceil(level * np.minimum(q_len, b_len) - 1e-9).astype(np.int64)
    inter = np.empty(pos.size, dtype=np.int64)
    by_source = np.argsort(b_source, kind="stable")
    bounds = np.searchsorted(b_source[by_source], np.arange(len(x_flats) + 2))
    for k, b_flat in enumerate([*x_flats, q_flat]):
        pick = by_source[bounds[k] : bounds[k + 1]]
        if pick.size:
            inter[pick] = pair_intersections(
                q_flat, q_at[pick], q_len[pick], b_flat, b_at[pick], b_len[pick], need[pick]
            )
    return inter.astype(np.float64), q_len.astype(np.float64), b_len.astype(np.float64)


def _stored_sets(
    index: DedupIndex, stored: list[int], held: Held, cache: SetCache
) -> tuple[I64, list[U32], I64, I64]:
    """Where the verification sets of the indexed documents ``stored`` (ascending) lie:
    per document, which of the returned arrays holds it, its start and its length there.

    Most candidates fail verification, and the cache holds most of their sets: those it
    vouches for (:meth:`SetCache.committed_spans`) are served in place, without reading
    their records; the others' records are read and join ``held.records``, and their
    sets are put end to end in the last array. A candidate that verifies has its record
    read afterwards (:func:`_read_named`), where a verdict names it.
    """
    records = held.records
    unheld = [n for n in stored if n not in records]
    c_source, flats, c_at, c_len = cache.committed_spans(unheld)
    served = c_source >= 0
    missing = [n for n, s in zip(unheld, served.tolist(), strict=True) if not s]
    if missing:
        records.update(index.read_records(missing))
    wanted = np.asarray(stored, dtype=np.int64)
    from_cache = np.searchsorted(wanted, np.asarray(unheld, dtype=np.int64)[served])
    rest = np.ones(wanted.size, dtype=bool)
    rest[from_cache] = False
    r_flat, r_at, r_len = joined(
        payload_arrays({n: records[n] for n in wanted[rest].tolist()}, cache)
    )
    source = np.full(wanted.size, len(flats), dtype=np.int64)
    at, length = np.empty_like(source), np.empty_like(source)
    source[from_cache], at[from_cache], length[from_cache] = (
        c_source[served], c_at[served], c_len[served],
    )  # fmt: skip
    at[rest], length[rest] = r_at, r_len
    return source, [*flats, r_flat], at, length


def _read_named(
    index: DedupIndex,
    held: Held,
    first: int,
    other: I64,
    contained: npt.NDArray[np.float64],
    reverse: npt.NDArray[np.float64],
    level: float,
) -> None:
    """Read the records of the stored candidates that a verdict may name (a containment
    either way at ``level``) and that :func:`_stored_sets` left unread."""
    named = np.unique(other[(other < first) & ((contained >= level) | (reverse >= level))])
    wanted = [n for n in named.tolist() if n not in held.records]
    if wanted:
        held.records.update(index.read_records(wanted))


def _batch_positions(found: Matches, first: int, docnums: I64) -> I64:
    """The live positions of the batch's documents indexed under ``docnums``."""
    by_docnum = np.full(int(found.docnum.max()) - first + 1, -1, dtype=np.int64)
    indexed = np.flatnonzero(found.docnum >= 0)
    by_docnum[found.docnum[indexed] - first] = indexed
    positions: I64 = by_docnum[docnums - first]
    return positions


def _set_sizes(
    first: int, sk: Sketch, found: Matches, held: Held, docnums: I64, cache: SetCache
) -> npt.NDArray[np.float64]:
    """The verification set size of each of ``docnums`` (held records, or the batch's
    own documents from ``first`` on): from the cache, where the matching pass left them."""
    sizes = np.zeros(docnums.size, dtype=np.float64)
    in_batch = docnums >= first
    if in_batch.any():
        sizes[in_batch] = sk.set_len[_batch_positions(found, first, docnums[in_batch])]
    stored = np.unique(docnums[~in_batch]).tolist()
    records = [held.records[n] for n in stored]
    with_text = [(n, r.payload) for n, r in zip(stored, records, strict=True) if r.text]
    rebuilt = iter(cache.sets([n for n, _ in with_text], [t for _, t in with_text]))
    size = [next(rebuilt).size if r.text else len(r.payload) >> 2 for r in records]
    if stored:
        where = np.searchsorted(np.asarray(stored, dtype=np.int64), docnums[~in_batch])
        sizes[~in_batch] = np.asarray(size, dtype=np.float64)[where]
    return sizes


def _names(
    docs: Sequence[Document], sk: Sketch, found: Matches, held: Held
) -> Callable[[int], str]:
    """The id of a docnum a relation names: a held record's, or a document's of the batch.
    Asked only for the few documents ``contains`` names, not built for every docnum."""
    records = held.records

    def name(n: int) -> str:
        record = records.get(n)
        if record is not None:
            return record.doc_id
        at = int(np.flatnonzero(found.docnum == n)[0])
        return docs[sk.live[at]].id

    return name


def _choose(
    out: Relations,
    found: Matches,
    config: DedupConfig,
    pos: I64,
    docnum: I64,
    contained: npt.NDArray[np.float64],
    reverse: npt.NDArray[np.float64],
    jaccard: npt.NDArray[np.float64],
    names: Callable[[int], str],
) -> None:
    """Each voting document's container (highest containment, ties to the earliest) and,
    failing one, the earlier document it contains most of."""
    n = pos.size
    c, r, j = contained[:n], reverse[:n], jaccard[:n]
    level = config.containment
    hit = np.flatnonzero(c >= level)
    order = hit[np.lexsort((docnum[hit], -c[hit], pos[hit]))]
    taken: set[int] = set()
    for k in order.tolist():
        p = int(pos[k])
        if p in taken:
            continue
        taken.add(p)
        x = int(docnum[k])
        found.match[p] = x
        found.similarity[p] = j[k]
        near = j[k] >= config.threshold
        out.excerpts += not near
        relation = Relation.NEAR_DUPLICATE if near else Relation.EXCERPT
        out.relation[p] = (relation, round(float(c[k]), 6))
    rev = np.flatnonzero(r >= level)
    order = rev[np.lexsort((docnum[rev], -r[rev], pos[rev]))]
    for k in order.tolist():
        p = int(pos[k])
        if p in taken or p in out.contains:
            continue
        out.contains[p] = (names(int(docnum[k])), round(float(r[k]), 6))


def _bucket_puts(
    keys: list[bytes],
    fps: npt.NDArray[np.uint64],
    occ_key: npt.NDArray[np.intp],
    occ_pos: I64,
    appended: npt.NDArray[np.bool_],
    mine: Members,
    docnum: I64,
) -> tuple[OrderedPuts, npt.NDArray[np.uint64]]:
    """The sampled buckets the batch grows: the epoch's members, then the batch's, in
    key order (the keys are sorted: ``np.unique`` gave their values in order)."""
    grown = occ_key[appended]
    if not grown.size:
        return NO_ORDERED_PUTS, np.empty(0, dtype=np.uint64)
    new = docnum[occ_pos[appended]]
    pos = occ_pos[appended]
    # By key, then batch order: the occurrences come in batch order (sampling's), where a
    # stable sort by key alone gives it, cheaper than sorting by two keys.
    in_order = pos.size < 2 or bool((pos[1:] >= pos[:-1]).all())
    order = np.argsort(grown, kind="stable") if in_order else np.lexsort((pos, grown))
    grown, new = grown[order], new[order]
    starts = np.flatnonzero(np.r_[True, grown[1:] != grown[:-1]])
    touched = grown[starts]
    m_at, m_len, m_members = mine
    n_old, n_new = m_len[touched], np.diff(np.r_[starts, grown.size])
    # Every value laid out in one array, each bucket's members then the batch's, and cut
    # into values with one slice each: no Python step joining two parts per bucket.
    size = n_old + n_new
    out_at = np.cumsum(size) - size
    out = np.empty(int(size.sum()), dtype="<u8")
    out[spans(out_at, n_old)] = m_members[spans(m_at[touched], n_old)]
    out[spans(out_at + n_old, n_new)] = new
    raw = out.tobytes()
    bounds = (8 * out_at).tolist(), (8 * (out_at + size)).tolist()
    values = [raw[a:b] for a, b in zip(*bounds, strict=True)]
    return OrderedPuts([keys[k] for k in touched.tolist()], values), fps[touched]
