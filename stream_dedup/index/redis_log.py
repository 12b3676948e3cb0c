"""The shared index's change log: what each write added, for the other instances' filters.

A key filter (:mod:`stream_dedup.index.filter`) lets an index read only the look-up keys
it may hold: a batch's ~40,000 keys shrink to the few hundred that exist. A filter in one
instance's memory does not know the keys the other instances write, so until this log
the shared index kept none and read every key inside the lease, most of the lease's time.

Every write of the shared index publishes, in the same script that stores its redo
record (the commit point, :data:`~stream_dedup.index.redis_redo.COMMIT`), one log entry:
the epoch it writes to and the filter fingerprints of its look-up keys (8 bytes each),
appended to ``{ns}!log`` with the index's version ``{ns}!version`` incremented. An
instance that keeps a filter follows the log: it reads the version before building its
filter (so a write during the build is read again, which is harmless), reads the entries
past its position before it waits for the lease (optimistically: most of them are there
by then) and, in the script that takes the lease, the few appended meanwhile. Its filter
then holds every key any instance committed, and inside the lease only the keys it
cannot rule out are read.

The log keeps the last :data:`LOG_ENTRIES` entries (a 2,000-document batch's is ~300 KB).
An instance further behind than that (it had no batch while the others wrote many), or
one that reads an entry whose keys are unknown (a write made without fingerprints, such
as a snapshot's restore), cannot bring its filter up to date: it reads every key for that
batch, as before the log, and builds its filter again before its next lease.
"""

from __future__ import annotations

import numpy as np

from stream_dedup.core.hashing import U64

__all__ = ["LOG_ENTRIES", "PEEK", "READ", "TAKE", "ChangeCursor", "Changes", "encode_entry"]

#: Entries the log keeps: how far behind the others an instance may fall and still catch
#: up from the log (at ~300 KB per 2,000-document batch, ~10 MB of Redis memory).
LOG_ENTRIES = 32

#: The entries past ``from`` (ARGV's last) as ``{version, 1, entries...}``; ``{version, 0}``
#: when the log no longer reaches back that far; ``{version, 1}`` when not followed (-1).
_SINCE = """
local function since(version_key, log_key, from)
  local v = tonumber(redis.call('GET', version_key) or '0')
  local n = v - from
  if from < 0 or n <= 0 then return {v, 1} end
  if n > redis.call('LLEN', log_key) then return {v, 0} end
  local out = redis.call('LRANGE', log_key, -n, -1)
  table.insert(out, 1, 1)
  table.insert(out, 1, v)
  return out
end
"""
#: KEYS: version, log. ARGV: from. The log past ``from``, read outside the lease.
READ = _SINCE + "return since(KEYS[1], KEYS[2], tonumber(ARGV[1]))\n"
#: KEYS: lock, redos, version, log. ARGV: token, ttl_ms, from. Takes the lease if it is
#: free (else ``false``) and answers, in the same round trip, the versions of the redo
#: records waiting to be applied (:mod:`.redis_redo`) and the log past ``from``:
#: ``{{waiting...}, version, status, entries...}``.
TAKE = (
    _SINCE
    + """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local out = since(KEYS[3], KEYS[4], tonumber(ARGV[3]))
table.insert(out, 1, redis.call('HKEYS', KEYS[2]))
return out
"""
)
#: KEYS: redos, version, log. ARGV: from. What :data:`TAKE` answers, without taking the
#: lease: the index as of one version, for deciding a batch before the lease
#: (``{{waiting...}, version, status, entries...}``, read in one step).
PEEK = (
    _SINCE
    + """
local out = since(KEYS[2], KEYS[3], tonumber(ARGV[1]))
table.insert(out, 1, redis.call('HKEYS', KEYS[1]))
return out
"""
)

#: Per entry: the epoch written and the fingerprints of its look-up keys.
Changes = list[tuple[int, U64]]
_UNKNOWN = b""


def encode_entry(epoch: int, fingerprints: U64 | None) -> bytes:
    """A log entry: the epoch (uint64 LE) then the fingerprints (uint64 LE each); empty
    when the write's keys are unknown."""
    if fingerprints is None:
        return _UNKNOWN
    return np.array([epoch], dtype="<u8").tobytes() + fingerprints.astype("<u8").tobytes()


def _decode_entry(entry: bytes) -> tuple[int, U64] | None:
    if len(entry) < 8:
        return None
    epoch = int(np.frombuffer(entry, dtype="<u8", count=1)[0])
    return epoch, np.frombuffer(entry, dtype="<u8", offset=8).astype(np.uint64)


class ChangeCursor:
    """One instance's place in the log and the entries it has read but not handed on.

    Not following (``at is None``) until :meth:`follow`: an instance without a filter
    reads nothing from the log."""

    def __init__(self) -> None:
        self.at: int | None = None
        self._pending: Changes = []
        self._gap = False

    @property
    def position(self) -> int:
        """``from`` for the scripts: -1 while not following."""
        return -1 if self.at is None else self.at

    def follow(self, version: int) -> None:
        """Start at ``version``: the filter about to be built holds every write up to it."""
        self.at, self._pending, self._gap = version, [], False

    def read(self, reply: list[object]) -> None:
        """Take a ``since`` answer (``{version, status, entries...}``)."""
        if self.at is None:
            return
        version, status, *entries = reply
        if not isinstance(version, int) or version == self.at:
            return
        if version < self.at:  # the log started again (a Redis emptied): build anew
            self._gap = True
            return
        if status == 0:
            self._gap = True
        else:
            for entry in entries:
                decoded = _decode_entry(entry) if isinstance(entry, bytes) else None
                if decoded is None:
                    self._gap = True
                    break
                self._pending.append(decoded)
        self.at = version

    def own(self, version: int) -> None:
        """This instance's own write got ``version``: its keys reach its filter directly,
        so the cursor moves past it when it is the next entry (else it is read again)."""
        if self.at is not None and version == self.at + 1:
            self.at = version

    def drain(self) -> Changes | None:
        """The entries read since the last call, oldest first; ``None`` when some could
        not be read (the filter must be built again)."""
        if self._gap:
            self._pending, self._gap, self.at = [], False, None
            return None
        out, self._pending = self._pending, []
        return out
