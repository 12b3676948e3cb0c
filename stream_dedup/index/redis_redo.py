"""The shared index's redo records: the commit point inside the lease, the write after it.

Only deciding a batch and its commit point need the index's lease; applying the write
(some 20 fields per document into the 256 record hashes, ~20 µs of Redis CPU per
document) does not, so it runs after the lease is released, in parallel with the next
holder's deciding. Three rules keep that whole (``docs/shared-index.md``, "The atomic
write across slots"):

* **The commit point is a versioned redo record.** One script checks the lease, takes
  the index's next version, stores the write as field ``<version>`` of the hash
  ``{ns}!redos``, appends the change log entry and releases the lease, answering the
  versions still waiting to be applied.
* **Readers overlay what waits.** Whoever takes the lease next reads the waiting redo
  records and reads through them (:class:`Overlay`): a value waiting in a redo record is
  newer than the stored one, and the newest waiting one wins.
* **Writes reach each hash in version order.** Every record hash (and the own keys)
  holds the version of the last write applied to it (field :data:`VERSION_FIELD`, key
  ``{ns}!applied``); the script applying a write's part to it does nothing if a newer
  version is there already. A committer first applies the earlier writes still waiting
  (a crashed or slow instance's), then its own, then deletes their redo records. So a
  version reaches a hash only after every earlier one reached every hash, and a late
  applier never writes an older value over a newer one. A write its writer is applying
  (beside the next holder's turn) is left to it up to :data:`APPLIER_GRACE_S`, not sent
  twice; past that (the writer died after its commit point) the next applier applies it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import redis
from redis.cluster import RedisCluster

from stream_dedup.core.hashing import U64
from stream_dedup.index.keys import SCOPED
from stream_dedup.index.redis_layout import Groups, RedisLayout, decode_redo, redo_spans
from stream_dedup.index.redis_wire import Command, Wire

__all__ = [
    "COMMIT",
    "FOLLOW",
    "VERSION_FIELD",
    "Flat",
    "Overlay",
    "RedoQueue",
    "plain",
    "versioned",
]

#: The field of a record hash holding the version of the last write applied to it. It
#: starts with a zero byte, which no index key does, so no prefix scan ever matches it.
VERSION_FIELD = b"\x00v"
#: Fields (or own keys) per apply script: Lua's stack takes a few thousand arguments.
_CHUNK = 1000
#: How long an applier leaves an earlier write to its writer (module docstring): a write
#: is applied in tens of ms; a writer killed after its commit point costs this once.
APPLIER_GRACE_S = 1.0

#: KEYS: lock, redos, version, log, epoch set. ARGV: token ('' when no lease is held),
#: ttl_ms, redo record, log entry, entries kept, epoch. Goes on only while ``token`` holds
#: the lease; stores the redo record under the next version, appends the log entry, lists
#: the epoch (0: none) among the stored ones, releases the lease, and answers ``{version,
#: waiting versions...}`` (this one among them). The whole write, document records
#: included, is in the record: this is the write's one round trip inside the lease.
COMMIT = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASE lost: another instance holds the index')
end
local v = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], v, ARGV[3])
redis.call('RPUSH', KEYS[4], ARGV[4])
redis.call('LTRIM', KEYS[4], -tonumber(ARGV[5]), -1)
if ARGV[6] ~= '0' then redis.call('SADD', KEYS[5], ARGV[6]) end
if ARGV[1] ~= '' then redis.call('DEL', KEYS[1]) end
local out = redis.call('HKEYS', KEYS[2])
table.insert(out, 1, v)
return out
"""
#: KEYS: version, redos. The index's version and the versions of the writes not applied
#: yet, read together: a filter built from a scan follows the log from before the oldest.
FOLLOW = """
local out = redis.call('HKEYS', KEYS[2])
table.insert(out, 1, tonumber(redis.call('GET', KEYS[1]) or '0'))
return out
"""
#: KEYS: a record hash. ARGV: version field, version, then field, value pairs.
_APPLY_HASH = """
local v = tonumber(ARGV[2])
if tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') > v then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 3))
return 1
"""
#: KEYS: the applied version, then own keys. ARGV: version, then the keys' values.
_APPLY_OWN = """
local v = tonumber(ARGV[1])
if tonumber(redis.call('GET', KEYS[1]) or '0') > v then return 0 end
for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[i]) end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


class Flat(NamedTuple):
    """A write as its redo record holds it: the index's keys and values, not by hash;
    those before ``first`` mixed, the rest band buckets in key order."""

    epoch: int
    keys: list[bytes]
    values: list[bytes]
    first: int

    def grouped(self, layout: RedisLayout) -> Groups:
        """The write by container (record hash or own keys), to apply it."""
        keys, values, first = self.keys, self.values, self.first
        groups = layout.grouped(keys[:first], values[:first], self.epoch)
        for name, (fields, vals) in layout.grouped(
            keys[first:], values[first:], self.epoch
        ).items():
            entry = groups.setdefault(name, ([], []))
            entry[0].extend(fields)
            entry[1].extend(vals)
        return groups


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


def plain(groups: Groups, epoch_set: bytes, epoch: int) -> list[Command]:
    """The commands writing ``groups`` without a version check: the one redo record of
    a release before versioned redo records, finished at opening."""
    commands: list[Command] = [(b"SADD", epoch_set, epoch)] if epoch else []
    for name, (fields, values) in groups.items():
        for start in range(0, len(fields), _CHUNK):
            part = fields[start : start + _CHUNK]
            pairs: list[Any] = [None] * (2 * len(part))
            pairs[::2] = part
            pairs[1::2] = values[start : start + _CHUNK]
            commands.append((b"HSET", name, *pairs) if name else (b"MSET", *pairs))
    return commands


def versioned(layout: RedisLayout, version: int, groups: Groups) -> list[Command]:
    """The commands applying ``groups`` as write ``version``: each container's part only
    where no newer write has been applied."""
    commands: list[Command] = []
    for name, (fields, values) in groups.items():
        for start in range(0, len(fields), _CHUNK):
            part, vals = fields[start : start + _CHUNK], values[start : start + _CHUNK]
            if name:
                pairs: list[Any] = [None] * (2 * len(part))
                pairs[::2] = part
                pairs[1::2] = vals
                commands.append((b"EVAL", _APPLY_HASH, 1, name, VERSION_FIELD, version, *pairs))
            else:
                keys = (layout.applied, *part)
                commands.append((b"EVAL", _APPLY_OWN, len(keys), *keys, version, *vals))
    return commands


class RedoQueue:
    """The redo records of one index: applying those waiting, and reading them."""

    def __init__(self, client: redis.Redis | RedisCluster, wire: Wire, layout: RedisLayout):
        self._client, self._wire, self._layout = client, wire, layout
        #: This instance's own records not known to be applied (it need not read them),
        #: as stored and as written.
        self._own: dict[int, tuple[bytes, Flat | None]] = {}

    def keep(self, version: int, blob: bytes, redo: Flat | None) -> None:
        self._own[version] = (blob, redo)

    def _blobs(self, versions: Sequence[int]) -> dict[int, bytes]:
        """The records of ``versions`` still stored (one ``HMGET``), this instance's own
        from memory."""
        out = {v: self._own[v][0] for v in versions if v in self._own}
        missing = [v for v in versions if v not in out]
        if missing:
            blobs = self._client.hmget(self._layout.redos, missing)
            for v, blob in zip(missing, blobs, strict=True):
                if isinstance(blob, bytes):
                    out[v] = blob
        return out

    def overlay(self, waiting: Sequence[int]) -> Overlay:
        """What the records of ``waiting`` write, for the reads of a lease."""
        found = self._blobs(sorted(waiting)) if waiting else {}
        self._own = {v: r for v, r in self._own.items() if v in found}
        return Overlay([found[v] for v in sorted(found)])

    def apply(
        self, waiting: Sequence[int], epoch_set: bytes, grace_s: float = APPLIER_GRACE_S
    ) -> None:
        """Apply the records of ``waiting`` in version order, then delete them: each
        container's part only where no newer write was applied (the rule of the module
        docstring, which makes this safe in any number of instances at once). Another
        instance's record is first left to its writer, for up to ``grace_s``."""
        if not waiting:
            return
        ordered = self._left_to_apply(sorted(waiting), grace_s)
        found = self._blobs(ordered)
        commands: list[Command] = []
        for v in ordered:
            if v not in found:  # applied and deleted by another instance meanwhile
                continue
            kept = self._own[v][1] if v in self._own else None
            redo = kept if kept is not None else Flat(*decode_redo(found[v]))
            if redo.epoch:
                commands.append((b"SADD", epoch_set, redo.epoch))
            commands.extend(versioned(self._layout, v, redo.grouped(self._layout)))
        self._wire.run(commands)
        self._client.hdel(self._layout.redos, *ordered)
        for v in ordered:
            self._own.pop(v, None)

    def _left_to_apply(self, ordered: list[int], grace_s: float) -> list[int]:
        """``ordered`` without the other instances' records their writers applied while
        this one waited for them, up to ``grace_s`` (module docstring)."""
        others = [v for v in ordered if v not in self._own]
        deadline = time.monotonic() + grace_s
        pause = 0.0005
        while others and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
            others = sorted(set(others) & set(self.waiting()))
        return [v for v in ordered if v in self._own or v in others]

    def waiting(self) -> list[int]:
        """The versions whose records are stored, not known to be applied."""
        return sorted(int(v) for v in self._client.hkeys(self._layout.redos))
