"""Where the index's keys live in Redis, and the bytes of a redo record.

Used by :mod:`stream_dedup.index.redis_backend`, whose docstring says why the layout is
what it is: the index's own keys as plain keys in one hash slot, ``{<namespace>}:<key>``;
the records of documents as fields of 256 hashes per epoch, ``<namespace>:<epoch>:{<tag>}``,
the tag being a byte of the key that is already uniform (the last byte of a band hash,
text digest or docnum; the CRC-32 of an id, which is not uniform).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from stream_dedup.index.keys import BUCKET, SCOPED

if TYPE_CHECKING:  # the layout is imported by configuration, which needs no client
    import redis
    from redis.cluster import RedisCluster

__all__ = [
    "DEFAULT_NAMESPACE",
    "NAMESPACE",
    "OWN_TAG",
    "READ_CHUNK",
    "VERSION_FIELD",
    "Groups",
    "PackedBuckets",
    "RedisLayout",
    "decode_grouped_redo",
    "decode_redo",
    "encode_grouped_redo",
    "encode_redo",
    "redacted",
    "redo_spans",
    "tags_of",
]

DEFAULT_NAMESPACE = "stream-dedup"
#: What a namespace may be: it is inside every key, and its braces make the hash tag.
NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Hash tags of the records' 256 hashes.
_TAGS = [b"{%02x}" % i for i in range(256)]
_VERDICT = ord("v")
#: A band bucket's key: ``b``, the band (2 bytes), the band hash (8 bytes).
_BUCKET_KEY_SIZE = 11
_GLOB = re.compile(rb"([*?\[\]\\])")

#: Fields per HMGET / HSET command: long enough to amortise a command, short enough not to
#: stall a Redis node (single-threaded) for other clients.
READ_CHUNK = 1000
#: The field of a record hash holding the version of the last write applied to it
#: (:mod:`.redis_redo`). It starts with a zero byte, which no index key does, so no
#: prefix scan ever matches it.
VERSION_FIELD = b"\x00v"

#: Fields (or own keys) and their values, or positions, by container: a record hash's
#: Redis key, or ``b""`` for the own keys.
Groups = dict[bytes, tuple[list[bytes], list[Any]]]


def glob_escaped(prefix: bytes) -> bytes:
    """``prefix`` as a literal in a ``SCAN``/``HSCAN`` pattern."""
    return _GLOB.sub(rb"\\\1", prefix)


class RedisLayout:
    """The Redis keys of one index, named by its namespace."""

    def __init__(self, namespace: str) -> None:
        if not NAMESPACE.fullmatch(namespace):
            raise ValueError(f"Redis namespace {namespace!r}: use 1 to 64 of A-Z a-z 0-9 _ . -")
        ns = namespace.encode()
        #: Prefix of the own keys, and the backend's own keys, all in one slot.
        self.own = b"{" + ns + b"}:"
        self.lock = b"{" + ns + b"}!lock"
        #: The redo records waiting to be applied, by version (:mod:`.redis_redo`), and
        #: the version last applied to the own keys; ``redo`` is where a release before
        #: them kept its one redo record, finished at opening.
        self.redos = b"{" + ns + b"}!redos"
        self.applied = b"{" + ns + b"}!applied"
        self.redo = b"{" + ns + b"}!redo"
        self.epoch_set = b"{" + ns + b"}!epochs"
        #: The change log (:mod:`.redis_log`): the index's version and the last entries.
        self.version = b"{" + ns + b"}!version"
        self.log = b"{" + ns + b"}!log"
        self._records = ns + b":"

    def hash(self, epoch: int, tag: int) -> bytes:
        """The Redis key of the records hash ``tag`` of ``epoch``."""
        return self._records + b"%d:" % epoch + _TAGS[tag]

    def grouped(self, keys: Sequence[bytes], values: Sequence[Any] | None, epoch: int) -> Groups:
        """Fields (and their values, or positions) by container: records to the hash of
        ``epoch`` their tag names, own keys (container ``b""``) as they are."""
        fast = self._grouped_buckets(keys, values, epoch)
        if fast is not None:
            return fast
        groups = self._by_tag(np.array(tags_of(keys), dtype=np.int64), keys, values, epoch, 257)
        own = groups.pop(b"", None)
        if own is not None:
            groups[b""] = ([self.own + k for k in own[0]], own[1])
        return groups

    def reads(
        self, keys: Sequence[bytes], epoch: int
    ) -> tuple[list[tuple[bytes, ...]], list[list[int]]]:
        """The ``HMGET``/``MGET`` commands reading ``keys`` from ``epoch`` (up to
        :data:`READ_CHUNK` fields each) and, for each, the positions in ``keys`` it reads."""
        commands: list[tuple[bytes, ...]] = []
        places: list[list[int]] = []
        for name, (fields, positions) in self.grouped(keys, None, epoch).items():
            for start in range(0, len(fields), READ_CHUNK):
                part = fields[start : start + READ_CHUNK]
                commands.append((b"HMGET", name, *part) if name else (b"MGET", *part))
                places.append(positions[start : start + READ_CHUNK])
        return commands, places

    def scan(self, client: redis.Redis | RedisCluster, prefix: bytes, epoch: int) -> list[bytes]:
        """The keys of ``epoch`` starting with ``prefix``, sorted: ``HSCAN`` of its 256
        hashes (a walk of the whole epoch's records) and ``SCAN`` of the own keys.

        A key's first byte says where it lives (:meth:`grouped`), so a prefix walks only
        the side that can hold it: the stored offsets, read at every partition
        assignment, are own keys, and walking every document record of the epoch for them
        cost time in proportion to the index."""
        pattern = glob_escaped(prefix) + b"*"
        found: list[bytes] = []
        scoped = not prefix or prefix[0] in SCOPED
        own = not prefix or prefix[0] not in SCOPED
        for tag in range(256 if scoped else 0):
            scan = client.hscan_iter(self.hash(epoch, tag), match=pattern, count=5000)
            found.extend(f for f, _ in scan if f != VERSION_FIELD)  # the hash's own field
        if epoch == 0 and own:
            cut = len(self.own)
            scan_own = client.scan_iter(match=self.own + pattern, count=5000)
            found.extend(rkey[cut:] for rkey in scan_own)
        found.sort()
        return found

    def _by_tag(
        self,
        tags: np.ndarray[Any, Any],
        keys: Sequence[bytes],
        values: Sequence[Any] | None,
        epoch: int,
        kinds: int = 256,
    ) -> Groups:
        """``keys`` (with ``values``, or their positions) by ``tags`` (256: own keys,
        container ``b""``), each group in the keys' order; one sort, no step per key."""
        order = np.argsort(tags, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(tags, minlength=kinds)))).tolist()
        where = order.tolist()
        if len(where) < 2:  # itemgetter of one position answers the item, not a tuple
            fields: Sequence[Any] = list(keys)
            second: Sequence[Any] = where if values is None else list(values)
        else:
            fields = itemgetter(*where)(keys)
            second = where if values is None else itemgetter(*where)(values)
        groups: Groups = {}
        for tag in range(kinds):
            a, b = bounds[tag], bounds[tag + 1]
            if a < b:
                name = b"" if tag == 256 else self.hash(epoch, tag)
                groups[name] = (list(fields[a:b]), list(second[a:b]))
        return groups

    def _grouped_buckets(
        self, keys: Sequence[bytes], values: Sequence[Any] | None, epoch: int
    ) -> Groups | None:
        """:meth:`grouped` without a Python step per key, when every key is a band
        bucket's (most of what a batch reads and writes); ``None`` otherwise."""
        if len(keys) < 64:
            return None
        joined = b"".join(keys)
        if len(joined) != _BUCKET_KEY_SIZE * len(keys):
            return None
        rows = np.frombuffer(joined, dtype=np.uint8).reshape(-1, _BUCKET_KEY_SIZE)
        if not (rows[:, 0] == BUCKET[0]).all():
            return None
        return self._by_tag(rows[:, -1], keys, values, epoch)


#: The tag :func:`tags_of` gives an own key (sorted after the 256 record hashes').
OWN_TAG = 256


def tags_of(keys: Sequence[bytes]) -> list[int]:
    """The record hash each key's record lives in (0-255), or :data:`OWN_TAG` for an own
    key: ids are not uniform, so a verdict's is its CRC-32's low byte; the other kinds'
    keys end in a hash byte."""
    scoped, crc, verdict = SCOPED, zlib.crc32, _VERDICT
    return [
        OWN_TAG if k[0] not in scoped else crc(k) & 255 if k[0] == verdict else k[-1] for k in keys
    ]


def encode_redo(
    epoch: int,
    keys: Sequence[bytes],
    values: Sequence[bytes],
    first: int,
    buckets: PackedBuckets | None = None,
) -> bytes:
    """One value holding a write, as the index's keys and values, not yet grouped by
    hash (grouping is work the commit point need not wait for): epoch, count, ``first``
    (the keys before it are mixed, the rest band buckets in key order, grouped apart),
    every key's and value's length, then the bytes.

    ``buckets``, when given, are more band buckets after ``keys`` (a batch's ~30,000, as
    joined bytes: see :class:`PackedBuckets`), so the record is built without a Python
    object per bucket; the bytes are those of the same buckets in ``keys`` and ``values``.
    """
    n = len(keys) + (0 if buckets is None else buckets.size)
    counts = np.array([epoch, n, first], dtype="<u8")
    klen = np.fromiter(map(len, keys), dtype="<u4", count=len(keys))
    vlen = np.fromiter(map(len, values), dtype="<u4", count=len(values))
    if buckets is None:
        parts = [klen.tobytes(), vlen.tobytes(), b"".join(keys), b"".join(values)]
    else:
        more = np.full(buckets.size, _BUCKET_KEY_SIZE, dtype="<u4")
        parts = [
            klen.tobytes(),
            more.tobytes(),
            vlen.tobytes(),
            buckets.sizes.astype("<u4").tobytes(),
            b"".join(keys),
            buckets.keys,
            b"".join(values),
            buckets.values,
        ]
    return b"".join([counts.tobytes(), *parts])


class PackedBuckets(NamedTuple):
    """Band buckets for a redo record as joined bytes: ``size`` keys of 11 bytes each in
    ``keys``, their values in ``values``, value ``i`` ``sizes[i]`` bytes long."""

    size: int
    keys: bytes
    sizes: npt.NDArray[np.uint32]
    values: bytes


def redo_spans(blob: bytes) -> tuple[int, int, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Epoch, ``first``, and the (start, end) byte spans of the keys and of the values of
    a record of :func:`encode_redo`, each an array of shape (n, 2)."""
    epoch, n, first = (int(x) for x in np.frombuffer(blob, dtype="<u8", count=3))
    klen = np.frombuffer(blob, dtype="<u4", count=n, offset=24).astype(np.int64)
    vlen = np.frombuffer(blob, dtype="<u4", count=n, offset=24 + 4 * n).astype(np.int64)
    kend = 24 + 8 * n + np.cumsum(klen)
    vend = (int(kend[-1]) if n else 24) + np.cumsum(vlen)
    return epoch, first, np.stack([kend - klen, kend], 1), np.stack([vend - vlen, vend], 1)


def decode_redo(blob: bytes) -> tuple[int, list[bytes], list[bytes], int]:
    """Epoch, keys, values and ``first`` of a record of :func:`encode_redo`.

    A write's own instance applies it from here too, after the lease (its ~35,000 fields
    are not kept as Python objects from inside the lease): so the slices are taken by
    ``map`` in C, and the band bucket keys, 11 bytes each and side by side, by one array
    view."""
    epoch, first, keys, values = redo_spans(blob)
    get = blob.__getitem__
    tail = keys[first:]
    if tail.size and (tail[:, 1] - tail[:, 0] == _BUCKET_KEY_SIZE).all():
        start = int(tail[0, 0])
        head = list(map(get, map(slice, keys[:first, 0].tolist(), keys[:first, 1].tolist())))
        rows = np.frombuffer(blob, dtype=f"V{_BUCKET_KEY_SIZE}", count=len(tail), offset=start)
        key_list = head + rows.tolist()
    else:
        key_list = list(map(get, map(slice, keys[:, 0].tolist(), keys[:, 1].tolist())))
    value_list = list(map(get, map(slice, values[:, 0].tolist(), values[:, 1].tolist())))
    return epoch, key_list, value_list, first


def encode_grouped_redo(epoch: int, groups: Groups) -> bytes:
    """The one redo record ``{ns}!redo`` of releases before versioned redo records, by
    container: epoch, counts, containers with their number of fields, then every field's
    and value's length, then the bytes. Kept to finish such a record at opening."""
    names = list(groups)
    fields = list(chain.from_iterable(g[0] for g in groups.values()))
    values = list(chain.from_iterable(g[1] for g in groups.values()))
    parts = [names, fields, values]
    counts = np.array([epoch, len(names), len(fields)], dtype="<u8")
    sizes = np.array([len(g[0]) for g in groups.values()], dtype="<u4")
    lengths = [np.fromiter(map(len, p), dtype="<u4", count=len(p)) for p in parts]
    return b"".join(
        [counts.tobytes(), sizes.tobytes(), *(x.tobytes() for x in lengths)]
        + [b"".join(p) for p in parts]
    )


def decode_grouped_redo(blob: bytes) -> tuple[int, Groups]:
    """A record of :func:`encode_grouped_redo`."""
    epoch, n_names, n = (int(x) for x in np.frombuffer(blob, dtype="<u8", count=3))
    at = 24
    sizes = np.frombuffer(blob, dtype="<u4", count=n_names, offset=at).tolist()
    at += 4 * n_names
    lengths = []
    for count in (n_names, n, n):
        lengths.append(np.frombuffer(blob, dtype="<u4", count=count, offset=at).astype(np.int64))
        at += 4 * count
    parts: list[list[bytes]] = []
    for length in lengths:
        end = at + np.cumsum(length)
        start = end - length
        parts.append([blob[a:b] for a, b in zip(start.tolist(), end.tolist(), strict=True)])
        at = int(end[-1]) if length.size else at
    names, fields, values = parts
    groups: Groups = {}
    first = 0
    for name, size in zip(names, sizes, strict=True):
        groups[name] = (fields[first : first + size], values[first : first + size])
        first += size
    return epoch, groups


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))
