"""Verification sets rebuilt from payloads, kept by generation for the candidates to come.

A candidate's set is rebuilt from the text its record stores
(:mod:`stream_dedup.core.payload`), ~20 µs; re-runs of a story arrive close together, so
the sets of the documents a batch indexes and of the candidates it rebuilt are kept for the
batches after it. Keeping them one array per set cost the deciding thread ~8 µs per
document on a grown index (a copy, an ordered-dict entry, the byte count and an eviction
per set), as much as the rebuilds it saved. So sets are kept the way they arrive: one
array per batch (a *generation*: a batch's indexed documents, or the sets one call
rebuilt), each set a span of it. The budget counts generations, the oldest dropped first;
a set found in the older half of the generations held is copied into the newest, so a
text that keeps being a candidate stays, as with least-recently-used order, without a
step per set for the others.

Entries are found by docnum (hashing an int, not ~600 bytes of payload, per set kept and
per candidate) and hold the payload they were made from: an entry serves a record only
when the record's payload is equal (a ``memcmp``), and equal payloads are equal texts.
So a docnum given to another document (a shared index's batch decided again elsewhere)
cannot find a stale set. Entries of a dropped generation are not deleted one by one: a
lookup treats them as missing, and they are swept out in one pass once they are as many
as the live ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.hashing import U32
from stream_dedup.core.payload import decode_text, rebuild_flat
from stream_dedup.core.shingles import I64


@dataclass(slots=True)
class _Generation:
    """Sets kept together: ``flat`` holds ``count`` of them end to end."""

    flat: U32
    nbytes: int
    count: int


#: Where a kept set is: its generation, start and length there, and the payload it is of.
_Spot = tuple[int, int, int, bytes]


class SetCache:
    """Verification sets by docnum and payload, in generations dropped oldest first past a
    byte budget."""

    def __init__(self, max_bytes: int, config: DedupConfig) -> None:
        self.max_bytes = max_bytes
        self.config = config
        self._where: dict[int, _Spot] = {}
        self._generations: dict[int, _Generation] = {}  # oldest first
        self._next = 0
        self._bytes = 0
        self._live = 0  # entries of the generations held
        #: Sets asked for, and those rebuilt (not in the cache), since the start.
        self.asked = 0
        self.rebuilt = 0

    def __len__(self) -> int:
        oldest = self._oldest()
        return sum(spot[0] >= oldest for spot in self._where.values())

    @property
    def nbytes(self) -> int:
        """Bytes of the sets and payloads held."""
        return self._bytes

    def _oldest(self) -> int:
        """The oldest generation held (``_next`` when none is)."""
        return next(iter(self._generations), self._next)

    def sets(self, docnums: Sequence[int], payloads: Sequence[bytes]) -> list[U32]:
        """The verification set of each document (``docnums[i]`` storing ``payloads[i]``):
        from the cache, or rebuilt (and kept)."""
        where, generations = self._where, self._generations
        found: list[U32 | None] = []
        missing: list[int] = []
        renew: list[int] = []  # found in the older half: copied into the newest generation
        oldest = self._oldest()
        old = self._next - (len(generations) + 1) // 2
        for i, (d, p) in enumerate(zip(docnums, payloads, strict=True)):
            spot = where.get(d)
            if spot is None or spot[0] < oldest or spot[3] != p:
                missing.append(i)
                found.append(None)
                continue
            g, at, n, _ = spot
            found.append(generations[g].flat[at : at + n])
            if g < old:
                renew.append(i)
        self.asked += len(payloads)
        self.rebuilt += len(missing)
        if missing:
            texts = [decode_text(payloads[i]) for i in missing]
            flat, sizes = rebuild_flat(texts, self.config)
            ends = np.cumsum(sizes).tolist()
            for i, e, n in zip(missing, ends, sizes.tolist(), strict=True):
                found[i] = flat[e - n : e]
        kept = missing + renew
        if kept and self.max_bytes > 0:
            sets: list[U32] = [found[i] for i in kept]  # type: ignore[misc]
            self._add(
                [docnums[i] for i in kept],
                [payloads[i] for i in kept],
                np.concatenate(sets),
                [s.size for s in sets],
            )
        return found  # type: ignore[return-value]

    def keep_spans(
        self, docnums: I64, payloads: Sequence[bytes], flat: U32, at: I64, length: I64
    ) -> None:
        """Remember the set of document ``docnums[i]`` (storing ``payloads[i]``) as
        ``flat[at[i] : at[i] + length[i]]`` (one copy of those spans: a view would hold
        all of ``flat`` alive)."""
        if self.max_bytes <= 0 or not payloads:
            return
        starts, lengths = at.tolist(), length.tolist()
        sets = [flat[s : s + n] for s, n in zip(starts, lengths, strict=True)]
        self._add(docnums.tolist(), payloads, np.concatenate(sets), lengths)

    def _add(
        self, docnums: list[int], payloads: Sequence[bytes], flat: U32, lengths: list[int]
    ) -> None:
        """A new generation: ``flat`` holds the sets of ``docnums`` end to end."""
        g = self._next
        self._next += 1
        ends = itertools.accumulate(lengths)
        self._where.update(
            zip(
                docnums,
                ((g, e - n, n, p) for e, n, p in zip(ends, lengths, payloads, strict=True)),
                strict=True,
            )
        )
        nbytes = flat.nbytes + sum(map(len, payloads))
        self._generations[g] = _Generation(flat, nbytes, len(lengths))
        self._bytes += nbytes
        self._live += len(lengths)
        generations = self._generations
        while self._bytes > self.max_bytes and generations:
            gone = generations.pop(next(iter(generations)))
            self._bytes -= gone.nbytes
            self._live -= gone.count
        if len(self._where) > 2 * self._live + 1024:  # about once per generation dropped
            self._sweep()

    def _sweep(self) -> None:
        """Forget the entries of dropped generations in one pass (they hold payloads)."""
        oldest = self._oldest()
        self._where = {d: s for d, s in self._where.items() if s[0] >= oldest}
