"""The commands applying a redo record, its records' fields packed straight from its bytes.

Applying a write (:mod:`.redis_redo`) sends each record hash its fields in ``EVAL``
commands of up to 1,000 field-value pairs. Built as Python objects (a ``bytes`` per key
and per value sliced from the record, grouped by hash, packed by hiredis argument by
argument), the ~30,000 band buckets of a 2,000-document batch cost the writer's applier
thread most of its ~25 µs of CPU per document: on the cores and under the GIL the
deciding thread needs. Here the fields of each command, RESP bulk strings
(``$<length>\\r\\n<bytes>\\r\\n``, key then value), are copied out of the record by one
compiled loop that runs without the GIL, and only each command's head (script, hash,
version) is built in Python. Redis is sent what :func:`versioned` sends (from the
record's Python form, :class:`Flat`): the same fields and values to the same hashes
under the same version rule; only the order of a hash's fields, which the hash does not
keep, and so where its commands are cut, may differ. The own keys (a few counters and
offsets) keep the Python path.

Records too small to be worth loading the compiled loop for take the Python path
(:func:`~stream_dedup.core.jit.runs_compiled`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import hiredis
import numpy as np

from stream_dedup.core import jit
from stream_dedup.core.jit import kernel
from stream_dedup.index.keys import BUCKET
from stream_dedup.index.redis_layout import (
    OWN_TAG,
    VERSION_FIELD,
    Groups,
    RedisLayout,
    decode_redo,
    redo_spans,
    tags_of,
)
from stream_dedup.index.redis_wire import Command, Packed

__all__ = [
    "APPLY_HASH",
    "CHUNK",
    "Flat",
    "apply_commands",
    "load_kernel",
    "resp_bulks",
    "versioned",
]

#: Fields (or own keys) per apply script: Lua's stack takes a few thousand arguments.
CHUNK = 1000

#: KEYS: a record hash. ARGV: version field, version, then field, value pairs.
APPLY_HASH = """
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


def versioned(layout: RedisLayout, version: int, groups: Groups) -> list[Command]:
    """The commands applying ``groups`` as write ``version``: each container's part only
    where no newer write has been applied."""
    commands: list[Command] = []
    for name, (fields, values) in groups.items():
        for start in range(0, len(fields), CHUNK):
            part, vals = fields[start : start + CHUNK], values[start : start + CHUNK]
            if name:
                pairs: list[Any] = [None] * (2 * len(part))
                pairs[::2] = part
                pairs[1::2] = vals
                commands.append((b"EVAL", APPLY_HASH, 1, name, VERSION_FIELD, version, *pairs))
            else:
                keys = (layout.applied, *part)
                commands.append((b"EVAL", _APPLY_OWN, len(keys), *keys, version, *vals))
    return commands


def apply_commands(
    layout: RedisLayout, version: int, blob: bytes
) -> tuple[int, list[Command | Packed]]:
    """The epoch of the redo record ``blob`` and the commands applying it as write
    ``version`` (see the module docstring)."""
    epoch, first, keys, values = redo_spans(blob)
    n = len(keys)
    u8 = np.frombuffer(blob, dtype=np.uint8)
    tail = keys[first:]
    if not n or not jit.runs_compiled(items=2 * n) or not (u8[tail[:, 0]] == BUCKET[0]).all():
        return epoch, [*versioned(layout, version, Flat(*decode_redo(blob)).grouped(layout))]
    # The mixed keys' hashes by the layout's rule; a band bucket's is its key's last byte.
    get = blob.__getitem__
    mixed = list(map(get, map(slice, keys[:first, 0].tolist(), keys[:first, 1].tolist())))
    tags = np.concatenate(
        [np.array(tags_of(mixed), dtype=np.int64), u8[tail[:, 1] - 1].astype(np.int64)]
    )
    commands: list[Command | Packed] = []
    own = np.flatnonzero(tags == OWN_TAG).tolist()
    if own:
        own_values = [blob[values[i, 0] : values[i, 1]] for i in own]
        groups = {b"": ([layout.own + mixed[i] for i in own], own_values)}
        commands.extend(versioned(layout, version, groups))
    scoped = np.flatnonzero(tags != OWN_TAG)
    order = scoped[np.argsort(tags[scoped], kind="stable")]
    counts = np.bincount(tags[scoped], minlength=256).tolist()
    starts = np.empty(2 * order.size, dtype=np.int64)
    ends = np.empty(2 * order.size, dtype=np.int64)
    starts[0::2], ends[0::2] = keys[order, 0], keys[order, 1]
    starts[1::2], ends[1::2] = values[order, 0], values[order, 1]
    body, at = jit.compiled(resp_bulks)(u8, starts, ends)
    chunks = [  # (tag, first pair, end): at most CHUNK pairs each, hash by hash
        (tag, a, min(a + CHUNK, done + count))
        for tag, (count, done) in enumerate(
            zip(counts, np.cumsum([0, *counts[:-1]]).tolist(), strict=True)
        )
        for a in range(done, done + count, CHUNK)
    ]
    # where each chunk's bulk strings start and end in ``body`` (not at.tolist(): one
    # Python int per field)
    cut = at[2 * np.array([(a, b) for _, a, b in chunks], dtype=np.int64)].tolist()
    view = memoryview(body)
    rests: dict[int, bytes] = {}
    for (tag, a, b), (lo, hi) in zip(chunks, cut, strict=True):
        name = layout.hash(epoch, tag)
        rest = rests.get(tag)
        if rest is None:
            args: Command = (b"EVAL", APPLY_HASH, 1, name, VERSION_FIELD, version)
            packed = hiredis.pack_command(args)
            rest = rests[tag] = packed[packed.index(b"\r\n") + 2 :]  # without the count
        data = b"".join((b"*%d\r\n" % (6 + 2 * (b - a)), rest, view[lo:hi]))
        commands.append(Packed(name, data, _arguments(blob, starts, ends, a, b, name, version)))
    return epoch, commands


def _arguments(
    blob: bytes,
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    a: int,
    b: int,
    name: bytes,
    version: int,
) -> Callable[[], Command]:
    """The arguments of the command of pairs ``a`` to ``b``, made when asked (a cluster's
    redirection)."""

    def unpacked() -> Command:
        spans = zip(starts[2 * a : 2 * b].tolist(), ends[2 * a : 2 * b].tolist(), strict=True)
        pairs = [blob[s:e] for s, e in spans]
        return (b"EVAL", APPLY_HASH, 1, name, VERSION_FIELD, version, *pairs)

    return unpacked


def load_kernel() -> None:
    """Load :func:`resp_bulks` compiled (numba's cache, or a compile of a second or two the
    first time on a machine), as the service's warm-up asks the applier thread to: else
    the first large write would wait for it, and the next lease holder's applier with it."""
    jit.compiled(resp_bulks)(
        np.zeros(1, dtype=np.uint8), np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64)
    )


@kernel
def resp_bulks(data: Any, starts: Any, ends: Any) -> tuple[Any, Any]:
    """``data[starts[i] : ends[i]]`` for each ``i`` as RESP bulk strings, end to end, and
    where each one starts (``at[i]``; ``at[n]`` is the end)."""
    n = starts.size
    at = np.empty(n + 1, dtype=np.int64)
    at[0] = 0
    for i in range(n):
        length = ends[i] - starts[i]
        digits = 1
        rest = length
        while rest >= 10:
            rest //= 10
            digits += 1
        at[i + 1] = at[i] + 5 + digits + length  # $, digits, CRLF, bytes, CRLF
    out = np.empty(at[n], dtype=np.uint8)
    for i in range(n):
        p = at[i]
        length = ends[i] - starts[i]
        digits = at[i + 1] - p - 5 - length
        out[p] = 36  # $
        rest = length
        for j in range(digits, 0, -1):
            out[p + j] = 48 + rest % 10
            rest //= 10
        p += digits + 1
        out[p] = 13
        out[p + 1] = 10
        p += 2
        out[p : p + length] = data[starts[i] : ends[i]]
        p += length
        out[p] = 13
        out[p + 1] = 10
    return out, at
