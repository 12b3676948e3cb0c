"""The group's heads on the shared index: each partition's next undecided time, shared.

Instances of one consumer group on one Redis index decide in one time order
(``docs/group-order.md``). For that each instance publishes, per partition it owns, what
comes next there: the time of its next undecided record (``h``), "nothing buffered
since" (``e``), or "at its end" (``x``); and reads what the others published, to decide
only below their smallest head. This module is the Redis side of that exchange, kept
apart from the lease (:mod:`.redis_backend`): it needs no lease, because each partition
has one owner that writes its field, and a head read early is never too high (heads only
move forward while their owner lives; see the note for the exceptions).

Layout: one hash per scope (the consumer group) and topic, ``{<namespace>}!heads:<scope>:
<topic>``, in the index's own hash slot, so one script reads and writes every topic of the
group even on a cluster. A field is a partition number; its value is ASCII
``<kind> <time ms> <since ms> <seen ms> <owner>``: ``since`` is when an ``e`` began (kept
while the partition stays empty, so that its wait ends), ``seen`` when its owner last
wrote or touched it (a field not written for ``batch.max_idle_ms`` is an owner gone), and
``owner`` the writing instance's random token, so that a heartbeat refreshes only the
fields no newer owner has written since. Times are the Redis server's clock (``TIME``),
the one clock every instance shares.

Waking: a member held back by the others' heads waits on its own list,
``{<namespace>}!wake:<scope>:<owner>``, with a blocking pop (:meth:`GroupHeads.wait`),
and an exchange that moves a member's heads pushes to the lists of the owners it read
last (at most one entry each, expiring after a minute), so the member whose turn it is
goes on within a round trip of the hand-over instead of after its next poll. A wake-up
only says "look again": the waiter exchanges and computes its watermark as before, so a
wake-up lost or spurious changes when it looks, never what it may release.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import redis

from stream_dedup.errors import IndexUnreachableError

__all__ = ["AT_END", "EMPTY", "HEAD", "GroupHeads", "Head", "Published"]

HEAD = "h"
EMPTY = "e"
AT_END = "x"

#: Writes the caller's fields (``seen`` and, for an empty partition that was empty
#: already, the old ``since``), wakes the members whose lists follow the topics' keys,
#: and returns the server's time and every topic's hash. ARGV: the owner's token, the
#: number of fields written, the number of topics' keys (the rest of KEYS are wake-up
#: lists), then per field: the topic's key index, partition, kind, time.
_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner = ARGV[1]
local n = tonumber(ARGV[2])
local topics = tonumber(ARGV[3])
for j = 0, n - 1 do
  local key = KEYS[tonumber(ARGV[4 + 4 * j])]
  local field, kind, at = ARGV[5 + 4 * j], ARGV[6 + 4 * j], ARGV[7 + 4 * j]
  local since = now
  if kind == 'e' then
    local old = redis.call('HGET', key, field)
    if old and string.sub(old, 1, 1) == 'e' then
      since = tonumber(string.match(old, '^e %S+ (%S+)')) or now
    end
  end
  redis.call('HSET', key, field, kind .. ' ' .. at .. ' ' .. since .. ' ' .. now .. ' ' .. owner)
end
for i = topics + 1, #KEYS do
  redis.call('RPUSH', KEYS[i], '1')
  redis.call('LTRIM', KEYS[i], -1, -1)
  redis.call('PEXPIRE', KEYS[i], 60000)
end
local out = {now}
for i = 1, topics do
  out[#out + 1] = redis.call('HGETALL', KEYS[i])
end
return out
"""


#: A heartbeat: refreshes ``seen`` of the fields ``owner`` (ARGV[1]) wrote last, and
#: only those (a partition that moved to another instance is its new owner's).
_TOUCH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  local flat = redis.call('HGETALL', KEYS[i])
  for j = 1, #flat, 2 do
    local kind, at, since, owner = string.match(flat[j + 1], '^(%S+) (%S+) (%S+) %S+ (%S+)$')
    if owner == ARGV[1] then
      local value = kind .. ' ' .. at .. ' ' .. since .. ' ' .. now .. ' ' .. owner
      redis.call('HSET', KEYS[i], flat[j], value)
    end
  end
end
return now
"""


class Head(NamedTuple):
    """What comes next on one partition, as its owner published it."""

    kind: str  #: :data:`HEAD`, :data:`EMPTY` or :data:`AT_END`
    #: the next undecided record's time (epoch ms) when ``kind`` is HEAD; the offset its
    #: owner's consumer reached (-1: not known) when AT_END
    time: int
    since: int = 0  #: server ms: when an EMPTY began
    seen: int = 0  #: server ms: when its owner last wrote it
    owner: str = ""  #: the writing instance's token (whom to wake when heads move)


class Published(NamedTuple):
    """The exchange's answer: the server's clock and every partition's last head."""

    now_ms: int
    heads: dict[tuple[str, int], Head]


def _decode(value: bytes) -> Head | None:
    """A field's head, or None for a value this version cannot read (treated as absent)."""
    parts = value.split()
    if len(parts) != 5:
        return None
    try:
        return Head(
            parts[0].decode(), int(parts[1]), int(parts[2]), int(parts[3]), parts[4].decode()
        )
    except (ValueError, UnicodeDecodeError):
        return None


class GroupHeads:
    """Publishes this instance's heads and reads the group's, in one round trip."""

    def __init__(self, client: Any, own_prefix: bytes, scope: str, location: str) -> None:
        """``client``: the index's Redis client; ``own_prefix``: the index's own-slot
        prefix (``{<namespace>}``), so the hashes live beside the lease."""
        self._client = client
        self._prefix = own_prefix + b"!heads:" + scope.encode() + b":"
        self._wake_prefix = own_prefix + b"!wake:" + scope.encode() + b":"
        self._location = location
        self._script = client.register_script(_EXCHANGE)
        self._touch = client.register_script(_TOUCH)
        #: This instance's mark on the fields it writes.
        self.token = uuid.uuid4().hex[:16]

    @contextmanager
    def _failing(self, operation: str) -> Iterator[None]:
        try:
            yield
        except (redis.RedisError, OSError) as exc:
            raise IndexUnreachableError(self._location, operation, str(exc)) from exc

    def key(self, topic: str) -> bytes:
        """The Redis key of ``topic``'s heads."""
        return self._prefix + topic.encode()

    def wake_key(self, owner: str) -> bytes:
        """The Redis key of the list that wakes member ``owner`` (a token)."""
        return self._wake_prefix + owner.encode()

    def exchange(
        self,
        topics: Sequence[str],
        mine: Mapping[tuple[str, int], tuple[str, int]],
        wake: Sequence[str] = (),
    ) -> Published:
        """Write ``mine`` ((topic, partition) -> (kind, time)), wake the members ``wake``
        (their tokens), and read every head of ``topics`` (which must include the topics
        of ``mine``)."""
        order = {topic: i for i, topic in enumerate(topics)}
        args: list[Any] = [self.token, len(mine), len(topics)]
        for (topic, partition), (kind, at) in mine.items():
            args += [order[topic] + 1, partition, kind, at]
        keys = [self.key(t) for t in topics] + [self.wake_key(w) for w in wake]
        with self._failing("exchanging the group's heads"):
            raw = self._script(keys=keys, args=args)
        heads: dict[tuple[str, int], Head] = {}
        for topic, flat in zip(topics, raw[1:], strict=True):
            for field, value in zip(flat[::2], flat[1::2], strict=True):
                head = _decode(value)
                if head is not None:
                    heads[(topic, int(field))] = head
        return Published(int(raw[0]), heads)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for another member to wake this one (its heads moved);
        True if woken. A wake-up pushed since the last wait returns at once."""
        with self._failing("waiting for the group's heads"):
            got = self._client.blpop([self.wake_key(self.token)], timeout=max(timeout_s, 0.001))
        return got is not None

    def touch(self, topics: Sequence[str]) -> None:
        """Refresh ``seen`` of the fields this instance wrote last (a heartbeat while its
        loop is busy: waiting for the lease, deciding, delivering)."""
        with self._failing("refreshing the group's heads"):
            self._touch(keys=[self.key(t) for t in topics], args=[self.token])
