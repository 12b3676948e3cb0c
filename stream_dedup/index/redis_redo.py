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
  applier never writes an older value over a newer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from stream_dedup.index.redis_layout import Groups, RedisLayout, decode_redo
from stream_dedup.index.redis_wire import Command, Wire

__all__ = ["COMMIT", "VERSION_FIELD", "Overlay", "RedoQueue"]

#: The field of a record hash holding the version of the last write applied to it. It
#: starts with a zero byte, which no index key does, so no prefix scan ever matches it.
VERSION_FIELD = b"\x00v"
#: Fields (or own keys) per apply script: Lua's stack takes a few thousand arguments.
_CHUNK = 1000

#: KEYS: lock, redos, version, log. ARGV: token ('' when no lease is held), ttl_ms, redo
#: record, log entry, entries kept. Goes on only while ``token`` holds the lease; stores the
#: redo record under the next version, appends the log entry, releases the lease, and
#: answers ``{version, waiting versions...}`` (this one among them).
COMMIT = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASE lost: another instance holds the index')
end
local v = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], v, ARGV[3])
redis.call('RPUSH', KEYS[4], ARGV[4])
redis.call('LTRIM', KEYS[4], -tonumber(ARGV[5]), -1)
if ARGV[1] ~= '' then redis.call('DEL', KEYS[1]) end
local out = redis.call('HKEYS', KEYS[2])
table.insert(out, 1, v)
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

#: A decoded redo record: its epoch and its fields by container.
Redo = tuple[int, Groups]


class Overlay:
    """Values of the redo records still waiting, by container and field: read through
    inside the lease, where they are newer than what the hashes hold."""

    def __init__(self, waiting: Sequence[Redo] = ()) -> None:
        self._by_name: dict[bytes, dict[bytes, bytes]] = {}
        for _, groups in waiting:  # oldest first: a newer value replaces an older one
            for name, (fields, values) in groups.items():
                self._by_name.setdefault(name, {}).update(zip(fields, values, strict=True))

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def fill(self, name: bytes, fields: Sequence[bytes], values: list[Any]) -> None:
        """Replace ``values`` (read from container ``name``) by the waiting ones."""
        waiting = self._by_name.get(name)
        if waiting:
            for i, field in enumerate(fields):
                value = waiting.get(field)
                if value is not None:
                    values[i] = value


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
        #: This instance's own records not known to be applied (it need not read them).
        self._own: dict[int, Redo] = {}

    def keep(self, version: int, redo: Redo) -> None:
        self._own[version] = redo

    def _read(self, versions: Sequence[int]) -> dict[int, Redo]:
        """The records of ``versions`` still stored (one ``HMGET``), this instance's own
        from memory."""
        out = {v: self._own[v] for v in versions if v in self._own}
        missing = [v for v in versions if v not in out]
        if missing:
            blobs = self._client.hmget(self._layout.redos, missing)
            for v, blob in zip(missing, blobs, strict=True):
                if isinstance(blob, bytes):
                    out[v] = decode_redo(blob)
        return out

    def overlay(self, waiting: Sequence[int]) -> Overlay:
        """What the records of ``waiting`` write, for the reads of a lease."""
        if not waiting:
            self._own.clear()
            return Overlay()
        found = self._read(sorted(waiting))
        self._own = {v: r for v, r in self._own.items() if v in found}
        return Overlay([found[v] for v in sorted(found)])

    def apply(self, waiting: Sequence[int], epoch_set: bytes) -> None:
        """Apply the records of ``waiting`` in version order, then delete them: each
        container's part only where no newer write was applied (the rule of the module
        docstring, which makes this safe in any number of instances at once)."""
        if not waiting:
            return
        ordered = sorted(waiting)
        found = self._read(ordered)
        commands: list[Command] = []
        for v in ordered:
            redo = found.get(v)
            if redo is None:  # applied and deleted by another instance meanwhile
                continue
            epoch, groups = redo
            if epoch:
                commands.append((b"SADD", epoch_set, epoch))
            commands.extend(versioned(self._layout, v, groups))
        self._wire.run(commands)
        self._client.hdel(self._layout.redos, *ordered)
        for v in ordered:
            self._own.pop(v, None)

    def waiting(self) -> list[int]:
        """The versions whose records are stored, not known to be applied."""
        return sorted(int(v) for v in self._client.hkeys(self._layout.redos))
