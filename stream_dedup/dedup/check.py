"""Checking texts against the index without adding them: for each, the earlier documents
most similar to it, with exact scores.

A check reads what deciding reads and writes nothing. The text's band buckets (in every
live epoch) and its exact-text key give the candidates, ranked as the matching pass ranks
them (most shared bands first, ties to the earliest) and cut at ``max_candidates`` (or at
``k``, if larger), so the best of them at or above the threshold is the document a
verdict would name. Each candidate is verified exactly against its stored verification
payload, read through the one accessor the deciding path uses
(:func:`~stream_dedup.dedup.reads.payloads`), and scored by similarity and containment
both ways (:func:`~stream_dedup.core.verify.overlap`); the ``k`` most similar ids are the
answer (an id with several revisions counts once, by its most similar one). The texts
of one call are each checked against the index alone, never against each other, and
documents expired by retention are no candidates.

A check has three steps: the sketch, the index reads (:func:`read_held`: everything the
check needs from the index, asked in one :class:`CheckReads` and answered in one
:class:`Held`), and the scoring. The reads run inside
:meth:`~stream_dedup.index.reads.IndexReads.consistent`, so a check may run on another
thread than the index's writer (the service's HTTP port does), and see one committed
state; the scoring runs after the lock is let go. The service's check process sends the
middle step to a reader process instead (:mod:`stream_dedup.service.check_readers`): one
request and one reply per check, both plain picklable values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from stream_dedup.core.bands import BandPlan
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.containment import SAMPLE_BAND, sample_keys, vote
from stream_dedup.core.hashing import U32, U64
from stream_dedup.core.lookup_keys import band_bucket_keys
from stream_dedup.core.match import I64
from stream_dedup.core.set_cache import SetCache
from stream_dedup.core.sketch import Sketch, sketch
from stream_dedup.core.verify import overlap
from stream_dedup.dedup.excerpts import VERIFIED, held_buckets
from stream_dedup.dedup.reads import payloads
from stream_dedup.errors import ConfigError
from stream_dedup.index.store import DedupIndex, DocRecord
from stream_dedup.models import CheckMatch, Relation

__all__ = ["CheckReads", "Held", "HeldReader", "answer", "check_k", "check_texts", "read_held"]


#: Bytes of rebuilt verification sets one check keeps (its texts' candidates).
_CACHE_BYTES = 8 << 20


def check_k(k: object, most: int | None = None) -> int:
    """``k`` as a check takes it: a whole number from 1 (to ``most``, when given);
    otherwise a :class:`~stream_dedup.errors.ConfigError` naming it."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError("k", f"must be a whole number of matches from 1, got {k!r}")
    if most is not None and k > most:
        raise ConfigError("k", f"must be at most {most}, got {k}")
    return k


@dataclass(slots=True)
class CheckReads:
    """What a check asks the index, from its texts' sketch: per live text its exact-text
    key and band bucket keys (with their fingerprints), its verification set (containment
    samples it), and how many candidates to keep (``cap``)."""

    n_live: int
    exact_keys: list[bytes]
    bucket_keys: list[bytes]
    bucket_fingerprints: U64
    set_flat: U32
    set_at: I64
    set_len: I64
    cap: int

    @classmethod
    def of(cls, sk: Sketch, cap: int) -> CheckReads:
        return cls(
            len(sk.live), sk.exact_keys, sk.bucket_keys, sk.bucket_fingerprints,
            sk.set_flat, sk.set_at, sk.set_len, cap,
        )  # fmt: skip


@dataclass(slots=True)
class Held:
    """What the index holds for a check: per live text its ranked candidate docnums, and
    the candidates' records."""

    candidates: list[list[int]]
    records: dict[int, DocRecord]


#: Answers a check's reads: :func:`read_held` on an index, or a process that runs it.
HeldReader = Callable[[CheckReads], Held]


def check_texts(
    index: DedupIndex | HeldReader,
    config: DedupConfig,
    plan: BandPlan,
    texts: Sequence[str],
    k: int,
) -> list[list[CheckMatch]]:
    """For each of ``texts``, the ``k`` indexed documents most similar to it (most similar
    first, ties to the earliest), each at least sharing a band or the exact text; nothing
    is written. ``config`` and ``plan`` are the index's detector and band plan; ``index``
    the index, or what answers its reads (:data:`HeldReader`)."""
    check_k(k)
    sk = sketch(list(texts), config, plan, payloads=False)  # nothing is stored
    reads = CheckReads.of(sk, max(k, config.max_candidates))
    held = read_held(index, reads) if isinstance(index, DedupIndex) else index(reads)
    cache = SetCache(_CACHE_BYTES, config)  # a candidate of several texts is rebuilt once
    answers: list[list[CheckMatch]] = [[] for _ in texts]
    for p, doc_index in enumerate(sk.live):
        query = _query(sk, config, p)
        answers[doc_index] = _best(held, p, query, config, k, cache)
    return answers


def read_held(index: DedupIndex, reads: CheckReads) -> Held:
    """The candidates of each live text and their records, read in a few batched reads
    inside the index's :meth:`~stream_dedup.index.reads.IndexReads.consistent`."""
    with index.consistent():
        return _read(index, reads)


def _read(index: DedupIndex, sk: CheckReads) -> Held:
    """The candidates of each live text and their records, read in a few batched reads."""
    n_live, cap = sk.n_live, sk.cap
    if not n_live:
        return Held([], {})
    cutoff = index.cutoff()
    _, text_docnums = index.read_decided([], sk.exact_keys)
    committed, older = index.read_bucket_members(
        sk.bucket_keys, sk.bucket_fingerprints, index.batch_epoch()
    )
    bands = len(sk.bucket_keys) // n_live
    parts: list[list[I64]] = [[] for _ in range(n_live)]
    for at, length, members in (committed,) if older is None else (committed, older):
        for key in np.flatnonzero(length).tolist():
            parts[key // bands].append(members[at[key] : at[key] + length[key]].astype(np.int64))
    candidates = [
        _ranked(doc_parts, text_docnums[p], cutoff, cap) for p, doc_parts in enumerate(parts)
    ]
    if index.params.containment_rate:
        for p, docnums in enumerate(_containers(index, sk, cutoff)):
            candidates[p] += [d for d in docnums if d not in candidates[p]]
    wanted = sorted({d for ranked in candidates for d in ranked})
    return Held(candidates, index.read_records(wanted))


def _containers(index: DedupIndex, sk: CheckReads, cutoff: int) -> list[list[int]]:
    """Each live text's containment candidates: the documents sharing its sampled
    values, as deciding finds them (:mod:`.excerpts`), reading the same buckets."""
    params = index.params
    occ_pos, values = sample_keys(
        sk.set_flat, sk.set_at, sk.set_len, params.containment_rate, params.seed
    )
    uniq, occ_key = np.unique(values, return_inverse=True)
    keys, fps = band_bucket_keys(SAMPLE_BAND, uniq)
    mine, older = index.read_bucket_members(keys, fps, index.batch_epoch())
    n_live = sk.n_live
    votes = vote(
        occ_pos,
        occ_key.astype(np.int64),
        held_buckets(mine, older, cutoff),
        np.full(n_live, -1, dtype=np.int64),
        np.ones(n_live, dtype=bool),
        params.containment_cap,
        VERIFIED,
        params.containment,
    )
    out: list[list[int]] = [[] for _ in range(n_live)]
    for p, d in zip(votes.pos.tolist(), votes.docnum.tolist(), strict=True):
        out[p].append(d)
    return out


def _ranked(parts: list[I64], same_text: int | None, cutoff: int, cap: int) -> list[int]:
    """One text's candidates as the matching pass ranks them: the document with the same
    text first, then bucket members by shared bands, ties to the earliest; the expired
    (below ``cutoff``) left out, at most ``cap`` of them."""
    first = [] if same_text is None or same_text < cutoff else [same_text]
    if not parts:
        return first
    members = np.concatenate(parts)
    unique, counts = np.unique(members[members >= cutoff], return_counts=True)
    ranked = unique[np.argsort(-counts, kind="stable")].tolist()
    return first + [d for d in ranked if d not in first][: cap - len(first)]


def _query(sk: Sketch, config: DedupConfig, p: int) -> U32:
    """What live text ``p`` is verified with: its verification set, or its signature."""
    if config.verify == "exact":
        at = int(sk.set_at[p])
        return sk.set_flat[at : at + int(sk.set_len[p])]
    signatures: U32 = sk.sigs.reshape(len(sk.live), -1)[p]
    return signatures


def _best(
    held: Held, p: int, query: U32, config: DedupConfig, k: int, cache: SetCache
) -> list[CheckMatch]:
    """Live text ``p``'s candidates verified (exact verification: sets, else signatures)
    and scored, the ``k`` most similar first (with containment on: the near-duplicates,
    then the documents the text is an excerpt of, most contained first, then the rest);
    ``cache`` rebuilds the sets of candidates that store compressed text. An id indexed
    under several revisions (texts) is named once, by its first revision in that order,
    so the answer holds ``k`` distinct ids when there are as many."""
    exact, threshold, level = config.verify == "exact", config.threshold, config.containment
    ranked = sorted(held.candidates[p])  # the payloads' reader takes docnums ascending
    docnums, flat, at, length = payloads({d: held.records[d] for d in ranked}, cache)
    scored: list[tuple[float, int, float | None, float | None]] = []
    for i, d in enumerate(docnums.tolist()):
        other = flat[at[i] : at[i] + length[i]]
        if exact:
            jaccard, share, reverse_share = overlap(query, other)
            scored.append((jaccard, d, round(share, 6), round(reverse_share, 6)))
        else:
            scored.append((float(np.count_nonzero(query == other)) / query.size, d, None, None))
    if level:
        excerpt = [s for s in scored if s[0] < threshold and (s[2] or 0.0) >= level]
        excerpt.sort(key=lambda s: (-(s[2] or 0.0), s[1]))
        rest = [s for s in scored if s[0] >= threshold or (s[2] or 0.0) < level]
        rest.sort(key=lambda s: (-s[0], s[1]))
        near = [s for s in rest if s[0] >= threshold]
        scored = near + excerpt + rest[len(near) :]
    else:
        scored.sort(key=lambda s: (-s[0], s[1]))
    out: list[CheckMatch] = []
    named: set[str] = set()
    for sim, d, contained, reverse in scored:
        rec = held.records[d]
        if rec.doc_id in named:
            continue  # an earlier revision of an id already named, scoring no higher
        if len(out) == k:
            break
        named.add(rec.doc_id)
        relation = Relation.NEAR_DUPLICATE if sim >= threshold else Relation.SIMILAR
        if relation is Relation.SIMILAR and level and (contained or 0.0) >= level:
            relation = Relation.EXCERPT
        out.append(
            CheckMatch(rec.doc_id, round(sim, 6), contained, reverse, rec.cluster_id, relation)
        )
    return out


def answer(doc_id: str, matches: Sequence[CheckMatch]) -> dict[str, object]:
    """One check's answer as the command line and the HTTP port write it (JSON)."""
    return {"id": doc_id, "matches": [m.to_json() for m in matches]}
