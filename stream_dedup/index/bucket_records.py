"""Band buckets' values: the docnums of a bucket's members, uint64 little-endian, oldest
first (see :mod:`.keys`).

A batch reads ~36,000 bucket keys and writes ~30,000, so neither side goes through a
Python object per member: what the index holds is handed to the matching pass
(:func:`~stream_dedup.core.match.match_batch`) as ``(at, len, members)`` arrays, and a
batch's new contents come back from it as arrays and are written in key order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U64
from stream_dedup.core.lookup_keys import PACKED_BUCKET_KEY
from stream_dedup.core.match import I64, Matches
from stream_dedup.index.backend import NO_ORDERED_PUTS, BucketArrays, OrderedPuts

__all__ = [
    "Built",
    "Members",
    "bucket_members",
    "bucket_puts",
    "held_members",
    "joined_members",
    "moved_bucket_puts",
]

#: Members per bucket key: where each key's members start in ``members``, how many there
#: are, and the docnums of all of them, one key after another.
Members = tuple[I64, I64, U64]


def held_members(n_keys: int, at: list[int], held: list[bytes]) -> Members:
    """The members one epoch holds per bucket key (``at``/``held``: the positions of the
    keys it holds and their values; the other keys have none)."""
    lengths = np.fromiter(map(len, held), dtype=np.int64, count=len(held)) >> 3
    com_len = np.zeros(n_keys, dtype=np.int64)
    com_at = np.zeros(n_keys, dtype=np.int64)
    com_len[at] = lengths
    com_at[at] = np.cumsum(lengths) - lengths
    return com_at, com_len, np.frombuffer(b"".join(held), dtype="<u8")


def joined_members(n_keys: int, epochs: list[tuple[list[int], list[bytes]]]) -> Members:
    """The members several epochs hold per bucket key, joined per key with the epochs
    oldest first (``epochs``: each one's ``at``/``held``, oldest first)."""
    pos = np.concatenate([np.asarray(at, dtype=np.int64) for at, _ in epochs])
    raws = [raw for _, held in epochs for raw in held]
    order = np.argsort(pos, kind="stable").tolist()  # per key, epochs stay oldest first
    joined = b"".join([raws[i] for i in order])
    sizes = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws)) >> 3
    lengths = np.bincount(pos, weights=sizes, minlength=n_keys).astype(np.int64)
    return np.cumsum(lengths) - lengths, lengths, np.frombuffer(joined, dtype="<u8")


def bucket_puts(
    bkeys: list[bytes],
    order: npt.NDArray[np.intp],
    slot: npt.NDArray[np.intp],
    found: Matches,
    bands: int,
) -> tuple[OrderedPuts, npt.NDArray[np.intp]]:
    """The bucket writes of the batch's indexed documents, in key order, and the positions
    in ``bkeys`` of the keys written.

    ``order`` is the keys' ascending order (:func:`stream_dedup.index.keys.bucket_order`),
    ``slot`` each key's first position with the same key. Each bucket is written once: a
    new bucket of one member is that docnum's eight bytes (one vectorised pass), any other
    its final contents from the matching pass.
    """
    per_key = np.repeat(found.docnum, bands)
    chosen = order[per_key[order] >= 0]
    if chosen.size == 0:
        return NO_ORDERED_PUTS, chosen
    # Equal keys sit side by side in key order: keep the first of each run.
    slots = slot[chosen]
    first = np.ones(chosen.size, dtype=bool)
    first[1:] = slots[1:] != slots[:-1]
    chosen = chosen[first]
    counts, members = bucket_members(chosen, slot, found, bands)
    joined = np.frombuffer(b"".join(bkeys), dtype=PACKED_BUCKET_KEY)[chosen]
    return _ordered(joined, counts, members), chosen


def bucket_members(
    chosen: npt.NDArray[np.intp], slot: npt.NDArray[np.intp], found: Matches, bands: int
) -> tuple[I64, U64]:
    """Each bucket's members as :func:`bucket_puts` writes them (``chosen``: the written
    keys' positions): a new bucket of one member is its document's docnum (one vectorised
    pass), any other its final contents from the matching pass."""
    slots = slot[chosen]
    single = found.docnum[chosen // bands].astype("<u8")
    longer = np.flatnonzero(found.content_len[slots] > 0)
    counts = np.ones(chosen.size, dtype=np.int64)
    members = single
    if longer.size:
        contents = found.contents.astype("<u8")  # docnums are never negative
        at, size = found.content_at[slots[longer]], found.content_len[slots[longer]]
        counts[longer] = size
        members = _joined(single, counts, longer, contents, at, size)
    return counts, members


def moved_bucket_puts(
    ordered: OrderedPuts,
    first: int,
    by: int,
    again: tuple[I64, npt.NDArray[np.intp], npt.NDArray[np.intp], Matches, int] | None = None,
) -> OrderedPuts:
    """``ordered`` (:func:`bucket_puts` of a batch numbered from ``first``) with the
    docnums the batch gave moved ``by`` on, and the buckets ``again`` names built anew.

    ``again``: the positions among ``ordered``'s keys of the buckets of documents decided
    again, their keys' positions in the batch, each batch key's first position with the
    same key, the batch's final matching pass and its bands: their members as
    :func:`bucket_members` gives them. The others keep theirs, moved (every number at or
    past ``first`` is one the batch gave, every other one it read)."""
    arrays = ordered.arrays
    if arrays is None:
        return ordered
    counts, members = arrays.counts, arrays.members
    if by:
        members = np.where(members >= first, members + np.uint64(by), members)
    if again is not None and again[0].size:
        at, chosen, slot, found, bands = again[0], again[1], again[2], again[3], again[4]
        sub_counts, sub_members = bucket_members(chosen, slot, found, bands)
        source = np.cumsum(counts) - counts
        source[at] = members.size + np.cumsum(sub_counts) - sub_counts
        counts = counts.copy()
        counts[at] = sub_counts
        members = np.concatenate([members, sub_members])[_spans(source, counts)]
    return _ordered(np.frombuffer(arrays.keys, dtype=PACKED_BUCKET_KEY), counts, members)


def _ordered(joined: npt.NDArray[np.void], counts: I64, members: U64) -> OrderedPuts:
    """Band buckets' puts (keys joined in key order, members per key) for any backend:
    the Python lists built only if one asks for them (:class:`Built`)."""
    n = int(joined.size)
    keys = Built(n, joined.tolist)
    values = Built(n, lambda: _values(counts, members))
    return OrderedPuts(keys, values, BucketArrays(joined.tobytes(), counts, members))


def _values(counts: I64, members: U64) -> list[bytes]:
    """Each bucket's value: its members as uint64 LE."""
    starts = np.cumsum(counts) - counts
    values: list[bytes] = members[starts].view("V8").tolist()
    longer = np.flatnonzero(counts > 1)
    if longer.size:
        raw = members.tobytes()
        at, size = (8 * starts[longer]).tolist(), (8 * counts[longer]).tolist()
        for k, a, n in zip(longer.tolist(), at, size, strict=True):
            values[k] = raw[a : a + n]
    return values


class Built(Sequence[bytes]):
    """A list built on first use. A batch's ~30,000 bucket keys and values as Python bytes
    are what RocksDB's write takes; the Redis backend builds its record from the arrays
    (:class:`~.backend.BucketArrays`) and never asks for them, so inside a shared index's
    lease they are never built."""

    __slots__ = ("_items", "_make", "_size")

    def __init__(self, size: int, make: Callable[[], list[bytes]]) -> None:
        self._size, self._make = size, make
        self._items: list[bytes] | None = None

    def _list(self) -> list[bytes]:
        if self._items is None:
            self._items = self._make()
        return self._items

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        return self._list()[i]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _spans(starts: I64, lengths: I64) -> I64:
    """The positions ``starts[i] .. starts[i] + lengths[i]``, one span after another."""
    ends = np.cumsum(lengths)
    out: I64 = np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64)
    out += np.repeat(starts - (ends - lengths), lengths)
    return out


def _joined(single: U64, counts: I64, longer: I64, contents: U64, at: I64, size: I64) -> U64:
    """Every written bucket's members, one bucket after another: a new bucket's one docnum
    (``single``), or the matching pass's contents (``at``/``size`` in ``contents``) for the
    buckets ``longer`` lists."""
    starts = np.cumsum(counts) - counts
    out = np.empty(int(counts.sum()), dtype="<u8")
    one = np.ones(counts.size, dtype=bool)
    one[longer] = False
    out[starts[one]] = single[one]
    out[_spans(starts[longer], size)] = contents[_spans(at, size)]
    return out
