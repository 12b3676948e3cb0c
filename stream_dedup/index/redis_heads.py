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
``<kind> <time ms> <since ms> <seen ms>``: ``since`` is when an ``e`` began (kept while
the partition stays empty, so that its wait ends), ``seen`` when its owner last wrote it
(a field not written for ``batch.max_idle_ms`` is an owner gone). Both are the Redis
server's clock (``TIME``), the one clock every instance shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["AT_END", "EMPTY", "HEAD", "GroupHeads", "Head", "Published"]

HEAD = "h"
EMPTY = "e"
AT_END = "x"

#: Writes the caller's fields (``seen`` and, for an empty partition that was empty
#: already, the old ``since``) and returns the server's time and every topic's hash.
#: ARGV: the number of fields written, then per field: topic's key index, partition,
#: kind, time.
_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
for j = 0, n - 1 do
  local key = KEYS[tonumber(ARGV[2 + 4 * j])]
  local field, kind, at = ARGV[3 + 4 * j], ARGV[4 + 4 * j], ARGV[5 + 4 * j]
  local since = now
  if kind == 'e' then
    local old = redis.call('HGET', key, field)
    if old and string.sub(old, 1, 1) == 'e' then
      since = tonumber(string.match(old, '^e %S+ (%S+)'))
    end
  end
  redis.call('HSET', key, field, kind .. ' ' .. at .. ' ' .. since .. ' ' .. now)
end
local out = {now}
for i = 1, #KEYS do
  out[#out + 1] = redis.call('HGETALL', KEYS[i])
end
return out
"""


class Head(NamedTuple):
    """What comes next on one partition, as its owner published it."""

    kind: str  #: :data:`HEAD`, :data:`EMPTY` or :data:`AT_END`
    time: int  #: the next undecided record's time (epoch ms) when ``kind`` is HEAD
    since: int = 0  #: server ms: when an EMPTY began
    seen: int = 0  #: server ms: when its owner last wrote it


class Published(NamedTuple):
    """The exchange's answer: the server's clock and every partition's last head."""

    now_ms: int
    heads: dict[tuple[str, int], Head]


def _decode(value: bytes) -> Head | None:
    """A field's head, or None for a value this version cannot read (treated as absent)."""
    parts = value.split()
    if len(parts) != 4:
        return None
    try:
        return Head(parts[0].decode(), int(parts[1]), int(parts[2]), int(parts[3]))
    except (ValueError, UnicodeDecodeError):
        return None


class GroupHeads:
    """Publishes this instance's heads and reads the group's, in one round trip."""

    def __init__(self, client: Any, own_prefix: bytes, scope: str) -> None:
        """``client``: the index's Redis client; ``own_prefix``: the index's own-slot
        prefix (``{<namespace>}``), so the hashes live beside the lease."""
        self._client = client
        self._prefix = own_prefix + b"!heads:" + scope.encode() + b":"
        self._script = client.register_script(_EXCHANGE)

    def key(self, topic: str) -> bytes:
        """The Redis key of ``topic``'s heads."""
        return self._prefix + topic.encode()

    def exchange(
        self, topics: Sequence[str], mine: Mapping[tuple[str, int], tuple[str, int]]
    ) -> Published:
        """Write ``mine`` ((topic, partition) -> (kind, time)), read every head of
        ``topics`` (which must include the topics of ``mine``)."""
        order = {topic: i for i, topic in enumerate(topics)}
        args: list[Any] = [len(mine)]
        for (topic, partition), (kind, at) in mine.items():
            args += [order[topic] + 1, partition, kind, at]
        raw = self._script(keys=[self.key(t) for t in topics], args=args)
        heads: dict[tuple[str, int], Head] = {}
        for topic, flat in zip(topics, raw[1:], strict=True):
            for field, value in zip(flat[::2], flat[1::2], strict=True):
                head = _decode(value)
                if head is not None:
                    heads[(topic, int(field))] = head
        return Published(int(raw[0]), heads)
