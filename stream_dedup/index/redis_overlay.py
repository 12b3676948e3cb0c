"""Reading through the shared index's redo records not applied yet (the overlay).

Inside a lease (and ``as_of``), the writes that passed their commit point but are not
applied to the record hashes yet (:mod:`.redis_redo`) are newer than what the hashes
hold: a read takes a key's value from the newest waiting record that writes it, and asks
Redis only for the rest. The next holder reads the previous holder's ~35,000-field record
this way on every lease, so a record is searched as it lies, without decoding it whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_dedup.core.hashing import U64
from stream_dedup.index.keys import SCOPED
from stream_dedup.index.redis_layout import redo_spans

__all__ = ["Overlay"]

_BUCKET_KEY_SIZE = 11
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _bucket_codes(rows: np.ndarray[Any, Any]) -> U64:
    """One number per band bucket key (rows of its 11 bytes): the band hash mixed with
    the band. Equal keys give equal numbers; a match is checked on the bytes."""
    band_hash = np.ascontiguousarray(rows[:, 3:11]).view("<u8").ravel()
    band = np.ascontiguousarray(rows[:, 1:3]).view("<u2").ravel().astype(np.uint64)
    codes: U64 = band_hash ^ (band * _MIX)
    return codes


def _bucket_rows(
    raw: np.ndarray[Any, Any], key_at: np.ndarray[Any, Any], where: np.ndarray[Any, Any], first: int
) -> np.ndarray[Any, Any]:
    """The 11 bytes of the bucket keys at positions ``where``, one row each: the band
    buckets after ``first`` (all of them, side by side, in a batch's record) as a view of
    the record, any others gathered."""
    tail = where[where >= first]
    head = where if not tail.size or tail.size != key_at.size - first else where[where < first]
    gathered: np.ndarray[Any, Any] = raw[key_at[head][:, None] + np.arange(_BUCKET_KEY_SIZE)]
    if head.size == where.size:  # the buckets are not all side by side at the end
        return gathered
    start = int(key_at[first])  # every key after first is a bucket's: side by side
    rows = raw[start : start + _BUCKET_KEY_SIZE * tail.size].reshape(-1, _BUCKET_KEY_SIZE)
    return np.concatenate([gathered, rows]) if head.size else rows


#: A band bucket key as one fixed-width byte string.
_KEY_BYTES = np.dtype(f"S{_BUCKET_KEY_SIZE}")
_SCOPED = np.frombuffer(bytes(sorted(SCOPED)), dtype=np.uint8)


def _sorted_tail(
    blob: bytes, key_at: np.ndarray[Any, Any], where: np.ndarray[Any, Any], first: int
) -> np.ndarray[Any, Any] | None:
    """The bucket keys at ``where`` as a view of ``blob`` when they are every key after
    ``first``, side by side and ascending (a batch's record), else ``None``."""
    n = key_at.size - first
    if not where.size or where.size != n or int(where[0]) != first:
        return None
    keys = np.frombuffer(blob, dtype=_KEY_BYTES, count=n, offset=int(key_at[first]))
    return keys if bool(np.all(keys[:-1] < keys[1:])) else None


class _RedoView:
    """One redo record's values, found by key without a Python step per field it holds.

    A 2,000-document write holds ~35,000 fields, nine in ten of them band buckets, and
    the next holder looks up a few hundred, inside its lease: the bucket keys (11 bytes
    each, side by side at the record's end, in key order) are read as one array view and
    found by a binary search over it (any other record's, by one sort and a binary search
    over numbers); the own keys, and the few thousand others once a read asks for one,
    by a dict of slices taken in C.
    """

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.epoch, first, key_spans, value_spans = redo_spans(blob)
        self._key_at, self._key_end, self._values = key_spans[:, 0], key_spans[:, 1], value_spans
        self._raw = raw = np.frombuffer(blob, dtype=np.uint8)
        bucket = (self._key_end - self._key_at) == _BUCKET_KEY_SIZE
        bucket[bucket] = raw[self._key_at[bucket]] == _B
        where = np.flatnonzero(bucket)
        #: A batch's buckets are its record's last keys, in key order: searched as they
        #: lie, as fixed-width byte strings (numpy compares them as ``memcmp`` does).
        self._sorted = _sorted_tail(blob, self._key_at, where, first)
        if self._sorted is not None:
            self._codes, self._bucket_at = np.empty(0, dtype=np.uint64), where
        else:
            codes = _bucket_codes(_bucket_rows(raw, self._key_at, where, first))
            order = np.argsort(codes)  # a record's keys are distinct: any order of ties
            self._codes, self._bucket_at = codes[order], where[order]
        others = np.flatnonzero(~bucket)
        own = others[~np.isin(raw[self._key_at[others]], _SCOPED)]
        #: Own keys (no epoch): found whatever epoch a read names. The others (documents,
        #: verdicts, texts) are put in a dict only when a read asks for one.
        self._own = self._keyed(own)
        self._others_at = others
        self._others: dict[bytes, int] | None = None

    def _keyed(self, at: np.ndarray[Any, Any]) -> dict[bytes, int]:
        """The keys at positions ``at``, each with its position: slices taken in C."""
        keys = map(
            self.blob.__getitem__, map(slice, self._key_at[at].tolist(), self._key_end[at].tolist())
        )
        return dict(zip(keys, at.tolist(), strict=True))

    def _value(self, i: int) -> bytes:
        start, end = self._values[i].tolist()
        return self.blob[start:end]

    def fill(self, epoch: int, keys: Sequence[bytes], out: list[Any]) -> list[int]:
        """Put the values this record writes for ``keys`` (index keys, read from
        ``epoch``) into ``out``; answers the positions it filled."""
        filled: list[int] = []
        buckets: list[int] = []
        same, own = self.epoch == epoch, self._own
        for pos, key in enumerate(keys):
            if len(key) == _BUCKET_KEY_SIZE and key[0] == _B:
                if same:
                    buckets.append(pos)
                continue
            if key[0] not in SCOPED:
                i = own.get(key)
            elif same:
                if self._others is None:
                    self._others = self._keyed(self._others_at)
                i = self._others.get(key)
            else:
                continue
            if i is not None:
                out[pos] = self._value(i)
                filled.append(pos)
        if buckets and self._bucket_at.size:
            self._fill_buckets(keys, buckets, out, filled)
        return filled

    def _fill_buckets(
        self, keys: Sequence[bytes], buckets: list[int], out: list[Any], filled: list[int]
    ) -> None:
        """The band buckets among ``keys`` (at ``buckets``): found by number, checked on
        their bytes and sliced out in array steps (a read inside the lease finds most of
        its ~1,000 bucket keys in the previous holder's record)."""
        joined = b"".join([keys[p] for p in buckets])
        if self._sorted is not None:
            wanted = np.frombuffer(joined, dtype=_KEY_BYTES)
            at = np.minimum(np.searchsorted(self._sorted, wanted), self._sorted.size - 1)
            hit = np.flatnonzero(self._sorted[at] == wanted)
            found = self._bucket_at[at[hit]]
        else:
            rows = np.frombuffer(joined, dtype=np.uint8).reshape(-1, _BUCKET_KEY_SIZE)
            codes = _bucket_codes(rows)
            at = np.minimum(np.searchsorted(self._codes, codes), self._codes.size - 1)
            hit = np.flatnonzero(self._codes[at] == codes)
            found = self._bucket_at[at[hit]]
            stored = self._raw[self._key_at[found][:, None] + np.arange(_BUCKET_KEY_SIZE)]
            equal = (stored == rows[hit]).all(axis=1)  # a number shared by two keys: not it
            hit, found = hit[equal], found[equal]
        spans = self._values[found]
        values = map(self.blob.__getitem__, map(slice, spans[:, 0].tolist(), spans[:, 1].tolist()))
        for q, value in zip(hit.tolist(), values, strict=True):
            pos = buckets[q]
            out[pos] = value
            filled.append(pos)


_B = ord("b")


class Overlay:
    """The redo records still waiting, read through inside the lease, where their values
    are newer than what the hashes hold (the newest waiting one wins)."""

    def __init__(self, waiting: Sequence[bytes] = ()) -> None:
        self._views = [_RedoView(blob) for blob in waiting]  # oldest first

    def __bool__(self) -> bool:
        return bool(self._views)

    def fill(self, epoch: int, keys: Sequence[bytes], out: list[Any]) -> set[int]:
        """Put the waiting values of ``keys`` (read from ``epoch``) into ``out``, the
        newest winning; answers the positions filled: those need no read of the hashes,
        whose values are older."""
        filled: set[int] = set()
        for view in self._views:
            filled.update(view.fill(epoch, keys, out))
        return filled
