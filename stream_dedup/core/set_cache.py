"""Verification sets rebuilt from payloads, kept by generation for the candidates to come.

A candidate's set is rebuilt from the text its record stores
(:mod:`stream_dedup.core.payload`), ~20 µs; re-runs of a story arrive close together, so
the sets of the documents a batch indexes and of the candidates it rebuilt are kept for the
batches after it. Keeping them one array per set cost the deciding thread ~8 µs per
document on a grown index (a copy, an ordered-dict entry, the byte count and an eviction
per set), as much as the rebuilds it saved. So sets are kept the way they arrive, with no
Python step per set: one array per batch (a *generation*: a batch's sketched sets, or the
sets one call rebuilt), each set a span of it, found through the generation's sorted
docnums with one ``searchsorted`` per generation for all of a batch's candidates. The
budget counts generations, the oldest dropped first; a set found in the older half of the
generations held is copied into the newest, so a text that keeps being a candidate stays,
as with least-recently-used order.

Sets are found through one dict, docnum -> where it is held (generation, position),
kept as generations come and go, not by searching every generation: at live rates a
batch holds a few dozen documents, so the budget holds hundreds of generations, and a
candidate held in none (most of them) would cost one ``searchsorted`` and its masks per
generation, a cost per batch that grows with the generations held, not with the batch.
Keeping the dict costs a few dict steps per set kept or dropped, not a copy or a hash of
its payload.

Sets are found by docnum and hold the payload they were made from: a set serves a record
only when the record's payload is equal (a ``memcmp``), and equal payloads are equal
texts. So a docnum given to another document (a shared index's batch decided again
elsewhere) cannot find a stale set. On an index one deduplicator alone writes, the sets
of committed docnums are also served without the record (:meth:`SetCache.trust_below`,
:meth:`SetCache.committed_spans`): containment's candidates, most of which fail, then
need no record read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.hashing import U32
from stream_dedup.core.payload import payload_sets
from stream_dedup.core.shingles import I64


@dataclass(slots=True)
class _Generation:
    """Sets kept together: document ``docnums[i]`` (ascending), storing ``payloads[i]``, has
    the set ``flat[at[i] : at[i] + length[i]]``."""

    flat: U32
    docnums: I64
    at: I64
    length: I64
    payloads: list[bytes]
    nbytes: int
    #: Its place in the order generations were kept (rises by one per generation).
    seq: int = 0


#: Where a docnum's set is held: (generation, position in it).
_Place = tuple[_Generation, int]


class SetCache:
    """Verification sets by docnum and payload, in generations dropped oldest first past a
    byte budget."""

    def __init__(self, max_bytes: int, config: DedupConfig) -> None:
        self.max_bytes = max_bytes
        self.config = config
        self._generations: list[_Generation] = []  # oldest first
        #: Per docnum, the generations holding it, oldest first, with its first position
        #: in each (the one a ``searchsorted`` would find).
        self._where: dict[int, list[_Place]] = {}
        self._seq = 0
        self._bytes = 0
        #: Sets asked for, and those rebuilt (not in the cache), since the start; and the
        #: candidates' sets not asked for, their text too short to verify
        #: (:mod:`stream_dedup.dedup.prune`, counted by its callers).
        self.asked = 0
        self.rebuilt = 0
        self.skipped = 0
        #: Docnums below this may be served without their records (:meth:`trust_below`).
        self._trusted = 0

    def __len__(self) -> int:
        return sum(g.docnums.size for g in self._generations)

    @property
    def nbytes(self) -> int:
        """Bytes of the sets and payloads held."""
        return self._bytes

    def sets(self, docnums: Sequence[int], payloads: Sequence[bytes]) -> list[U32]:
        """The verification set of each document (``docnums[i]`` storing ``payloads[i]``):
        from the cache, or rebuilt (and kept)."""
        wanted = np.asarray(docnums, dtype=np.int64)
        found, renew = self._find(wanted, payloads)
        missing = [i for i, s in enumerate(found) if s is None]
        self.asked += len(payloads)
        self.rebuilt += len(missing)
        rebuilt: U32 | None = None
        if missing:
            rebuilt, sizes = payload_sets([payloads[i] for i in missing], self.config)
            ends = np.cumsum(sizes).tolist()
            for i, e, n in zip(missing, ends, sizes.tolist(), strict=True):
                found[i] = rebuilt[e - n : e]
        if (missing or renew) and self.max_bytes > 0:
            self._keep_found(wanted, payloads, found, missing, renew, rebuilt)
        return found  # type: ignore[return-value]

    def trust_below(self, first: int) -> None:
        """Let :meth:`committed_spans` serve the sets of docnums below ``first`` (the index's
        count of committed documents) without their records, and drop every generation
        holding a docnum from ``first`` on.

        Only for an index this deduplicator alone writes, called before each batch is
        decided. A set is kept before its batch commits; a batch that never commits
        leaves sets under docnums the next batch gives out again, to other texts. Such
        sets are at or above the committed count when the next batch starts, so they go
        here, before any later commit could make them look committed; what stays below
        ``first`` was kept from a committed batch or rebuilt from a committed record,
        and a committed record never changes (docnums are not given out twice). On a
        shared index another instance commits docnums this one gave out and dropped, so
        nothing is trusted there: its sets are served by :meth:`sets` alone.
        """
        kept = [g for g in self._generations if not g.docnums.size or g.docnums[-1] < first]
        if len(kept) < len(self._generations):
            for g in self._generations:
                if g.docnums.size and g.docnums[-1] >= first:
                    self._unplace(g)
            self._generations = kept
            self._bytes = sum(g.nbytes for g in kept)
        self._trusted = first

    def committed_spans(self, docnums: Sequence[int]) -> tuple[I64, list[U32], I64, I64]:
        """Where the sets of ``docnums`` lie that :meth:`trust_below` vouches for, served
        without the records' payloads to compare: per docnum, the index of the array
        holding it in the returned list (-1: not held, or not vouched for), its start
        and its length there. The arrays are the generations' own, not copied.

        Reading a candidate's record only to learn that the cache holds its set cost ~5
        µs, and one array per set ~1 µs more: a caller verifies against the generations'
        arrays in place (one compiled call per array) and reads records only for the sets
        not held and for the candidates a verdict names.
        """
        wanted = np.asarray(docnums, dtype=np.int64)
        source = np.full(wanted.size, -1, dtype=np.int64)
        at, length = np.zeros(wanted.size, dtype=np.int64), np.zeros(wanted.size, dtype=np.int64)
        flats: list[U32] = []
        if not wanted.size or self._trusted <= 0:
            return source, flats, at, length
        held: dict[int, tuple[_Generation, list[int], list[int]]] = {}  # by seq
        where, trusted = self._where, self._trusted
        for i, d in enumerate(wanted.tolist()):
            places = where.get(d) if d < trusted else None
            if places:
                g, at_g = places[-1]  # the newest generation holding it
                hits = held.setdefault(g.seq, (g, [], []))
                hits[1].append(i)
                hits[2].append(at_g)
        old = self._older_than()
        renew: list[tuple[_Generation, I64]] = []  # found in the older half: kept anew
        for seq in sorted(held, reverse=True):  # newest first
            g, hit_list, j_list = held[seq]
            hit, j = np.asarray(hit_list, dtype=np.int64), np.asarray(j_list, dtype=np.int64)
            source[hit] = len(flats)
            flats.append(g.flat)
            at[hit], length[hit] = g.at[j], g.length[j]
            if seq < old:
                renew.append((g, j))
        self.asked += int(np.count_nonzero(source >= 0))
        if renew and self.max_bytes > 0:
            self._renew(renew)
        return source, flats, at, length

    def _renew(self, found: list[tuple[_Generation, I64]]) -> None:
        """Keep the sets at ``j`` of each generation once more, as the newest generation."""
        # One slice per set, joined with one copy: cheaper than a gather through an index
        # array of every element (a ragged arange), for sets of ~1,000 elements.
        pieces = [
            g.flat[a : a + n]
            for g, j in found
            for a, n in zip(g.at[j].tolist(), g.length[j].tolist(), strict=True)
        ]
        lengths = np.concatenate([g.length[j] for g, j in found])
        docnums = np.concatenate([g.docnums[j] for g, j in found])
        payloads = [g.payloads[k] for g, j in found for k in j.tolist()]
        order = np.argsort(docnums, kind="stable")
        at = np.cumsum(lengths) - lengths
        self._add(
            _Generation(
                np.concatenate(pieces),
                docnums[order],
                at[order],
                lengths[order],
                [payloads[k] for k in order.tolist()],
                0,
            )
        )

    def _find(self, wanted: I64, payloads: Sequence[bytes]) -> tuple[list[U32 | None], list[int]]:
        """The sets held for ``wanted``, newest generation first, each served when its
        payload equals ``payloads[i]``, and those found in the older half of the
        generations."""
        found: list[U32 | None] = [None] * wanted.size
        where = self._where
        old = self._older_than()
        renewed: list[tuple[int, int]] = []  # (-seq, i): found in the older half
        for i, d in enumerate(wanted.tolist()):
            places = where.get(d)
            if places is None:
                continue
            payload = payloads[i]
            for g, j in reversed(places):  # newest first
                if g.payloads[j] == payload:
                    start = int(g.at[j])
                    found[i] = g.flat[start : start + int(g.length[j])]
                    if g.seq < old:
                        renewed.append((-g.seq, i))
                    break
        # Renewed in the order a search of the generations newest first would find them.
        renewed.sort()
        return found, [i for _, i in renewed]

    def _older_than(self) -> int:
        """The seq from which generations are in the newer half (those below it are
        copied into the newest when found)."""
        generations = self._generations
        return generations[len(generations) // 2].seq if generations else 0

    def _place(self, generation: _Generation) -> None:
        """Enter ``generation``'s docnums in the dict (its first position of each)."""
        where = self._where
        for j, d in enumerate(generation.docnums.tolist()):
            places = where.get(d)
            if places is None:
                where[d] = [(generation, j)]
            elif places[-1][0] is not generation:
                places.append((generation, j))

    def _unplace(self, generation: _Generation) -> None:
        """Take ``generation``'s docnums out of the dict (it is dropped)."""
        where = self._where
        for d in generation.docnums.tolist():
            places = where.get(d)
            if places is None:
                continue  # a docnum held twice in it, already taken out
            if len(places) == 1:  # the usual case: held in this generation alone
                if places[0][0] is generation:
                    del where[d]
                continue
            rest = [p for p in places if p[0] is not generation]
            if rest:
                where[d] = rest
            else:
                del where[d]

    def _keep_found(
        self,
        docnums: I64,
        payloads: Sequence[bytes],
        found: list[U32 | None],
        missing: list[int],
        renew: list[int],
        rebuilt: U32 | None,
    ) -> None:
        """A generation of the sets a call rebuilt (``missing``, end to end in ``rebuilt``)
        and renewed (``renew``); ``rebuilt`` is kept as it is when it holds them all in the
        generation's order (docnums ascending, as a batch's records are read)."""
        kept = sorted(missing + renew, key=lambda i: int(docnums[i]))
        sets: list[U32] = [found[i] for i in kept]  # type: ignore[misc]
        lengths = np.fromiter((s.size for s in sets), dtype=np.int64, count=len(sets))
        flat = rebuilt if kept == missing else None
        self._add(
            _Generation(
                np.concatenate(sets) if flat is None else flat,
                docnums[kept],
                np.cumsum(lengths) - lengths,
                lengths,
                [payloads[i] for i in kept],
                0,
            )
        )

    def keep_spans(
        self, docnums: I64, payloads: Sequence[bytes], flat: U32, at: I64, length: I64
    ) -> None:
        """Remember the set of document ``docnums[i]`` (ascending, storing ``payloads[i]``)
        as ``flat[at[i] : at[i] + length[i]]``. ``flat`` is copied whole, one ``memcpy``:
        it may be a view of a larger buffer (the service's sketch arrives in one)."""
        if self.max_bytes <= 0 or not payloads:
            return
        order = np.argsort(docnums, kind="stable")  # already ascending when indexed in turn
        picked = [payloads[i] for i in order.tolist()]
        self._add(_Generation(flat.copy(), docnums[order], at[order], length[order], picked, 0))

    def _add(self, generation: _Generation) -> None:
        """Keep ``generation`` as the newest; drop the oldest while over the budget."""
        generation.nbytes = generation.flat.nbytes + 24 * generation.docnums.size
        generation.nbytes += sum(map(len, generation.payloads))
        generation.seq = self._seq
        self._seq += 1
        generations = self._generations
        generations.append(generation)
        self._place(generation)
        self._bytes += generation.nbytes
        while self._bytes > self.max_bytes and generations:
            dropped = generations.pop(0)
            self._bytes -= dropped.nbytes
            self._unplace(dropped)
