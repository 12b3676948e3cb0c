"""The shared index's redo records: the commit point inside the lease, the write after it.

Only deciding a batch and its commit point need the index's lease; applying the write
(some 20 fields per document into the 256 record hashes, ~20 µs of Redis CPU per
document) does not, so it runs after the lease is released, on the writer's applier
thread (:mod:`.redis_applier`), beside the next holder's deciding. Three rules keep that
whole (``docs/shared-index.md``, "The atomic write across slots"):

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

import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from stream_dedup.index.redis_layout import (
    VERSION_FIELD,
    Groups,
    RedisLayout,
    decode_grouped_redo,
)
from stream_dedup.index.redis_overlay import Overlay
from stream_dedup.index.redis_resp import CHUNK, Flat, apply_commands, versioned
from stream_dedup.index.redis_wire import Command, Packed, Wire

__all__ = [
    "COMMIT",
    "FOLLOW",
    "VERSION_FIELD",
    "Flat",
    "RedoQueue",
    "plain",
    "versioned",
]

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


def plain(groups: Groups, epoch_set: bytes, epoch: int) -> list[Command]:
    """The commands writing ``groups`` without a version check: the one redo record of
    a release before versioned redo records, finished at opening."""
    commands: list[Command] = [(b"SADD", epoch_set, epoch)] if epoch else []
    for name, (fields, values) in groups.items():
        for start in range(0, len(fields), CHUNK):
            part = fields[start : start + CHUNK]
            pairs: list[Any] = [None] * (2 * len(part))
            pairs[::2] = part
            pairs[1::2] = values[start : start + CHUNK]
            commands.append((b"HSET", name, *pairs) if name else (b"MSET", *pairs))
    return commands


class RedoQueue:
    """The redo records of one index: applying those waiting, and reading them."""

    def __init__(self, client: redis.Redis | RedisCluster, wire: Wire, layout: RedisLayout):
        self._client, self._wire, self._layout = client, wire, layout
        #: This instance's own records not known to be applied (it need not read them),
        #: as stored and as written. Applies run on the backend's applier thread while
        #: reads of the service thread take records from here: both under the lock.
        self._own: dict[int, tuple[bytes, Flat | None]] = {}
        self._lock = threading.Lock()
        #: Every version up to this one is applied: an apply that ran to its end applied
        #: each version it was given, and those are every one not applied before.
        self._applied_through = 0

    def keep(self, version: int, blob: bytes, redo: Flat | None) -> None:
        with self._lock:
            self._own[version] = (blob, redo)

    def _blobs(self, versions: Sequence[int]) -> dict[int, bytes]:
        """The records of ``versions`` still stored (one ``HMGET``), this instance's own
        from memory."""
        with self._lock:
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
        with self._lock:
            self._own = {v: r for v, r in self._own.items() if v in found}
        return Overlay([found[v] for v in sorted(found)])

    def apply(
        self, waiting: Sequence[int], epoch_set: bytes, grace_s: float = APPLIER_GRACE_S
    ) -> None:
        """Apply the records of ``waiting`` in version order, then delete them: each
        container's part only where no newer write was applied (the rule of the module
        docstring, which makes this safe in any number of instances at once). Another
        instance's record is first left to its writer, for up to ``grace_s``."""
        last = max(waiting, default=0)
        waiting = [v for v in waiting if v > self._applied_through]
        if not waiting:
            return
        ordered = self._left_to_apply(sorted(waiting), grace_s)
        found = self._blobs(ordered)
        commands: list[Command | Packed] = []
        for v in ordered:
            if v not in found:  # applied and deleted by another instance meanwhile
                continue
            with self._lock:
                kept = self._own.get(v, (b"", None))[1]
            applying: list[Command | Packed]
            if kept is not None:
                epoch = kept.epoch
                applying = [*versioned(self._layout, v, kept.grouped(self._layout))]
            else:
                epoch, applying = apply_commands(self._layout, v, found[v])
            if epoch:
                commands.append((b"SADD", epoch_set, epoch))
            commands.extend(applying)
        self._wire.run(commands)
        if ordered:
            self._client.hdel(self._layout.redos, *ordered)
        with self._lock:
            for v in ordered:
                self._own.pop(v, None)
        self._applied_through = max(self._applied_through, last)

    def _left_to_apply(self, ordered: list[int], grace_s: float) -> list[int]:
        """``ordered`` without the other instances' records their writers applied while
        this one waited for them, up to ``grace_s`` (module docstring)."""
        with self._lock:
            others = [v for v in ordered if v not in self._own]
        deadline = time.monotonic() + grace_s
        pause = 0.0005
        while others and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
            others = sorted(set(others) & set(self.waiting()))
        with self._lock:
            return [v for v in ordered if v in self._own or v in others]

    def recover(self, epoch_set: bytes) -> None:
        """Apply the writes a crash left after their commit point (at opening, in the
        lease): the redo records waiting, and first the one record of a release before
        them, written as it is, without a version check (:func:`plain`)."""
        legacy = self._layout.redo
        blob = self._client.get(legacy)
        if isinstance(blob, bytes):
            epoch, groups = decode_grouped_redo(blob)
            self._wire.run(plain(groups, epoch_set, epoch))
            self._client.delete(legacy)
        self.apply(self.waiting(), epoch_set, grace_s=0.0)

    def waiting(self) -> list[int]:
        """The versions whose records are stored, not known to be applied."""
        return sorted(int(v) for v in self._client.hkeys(self._layout.redos))
