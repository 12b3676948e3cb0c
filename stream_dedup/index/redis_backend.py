"""The index on Redis (one node or a Redis Cluster), shared by many service instances.

The :class:`~stream_dedup.index.backend.Backend` contract over Redis, plus what sharing
needs (see ``docs/shared-index.md``):

* **Where keys live.** The index's own keys (parameters, counters, offsets, the epoch
  table) share one hash slot, ``{<namespace>}:<key>``, so a write of several of them is one
  atomic ``MSET``. The records of documents (:data:`~stream_dedup.index.keys.SCOPED`) are
  spread over 256 slots, ``<namespace>:<epoch>:{<tag>}<key>`` with ``tag`` a byte of the
  key's CRC-32, so a cluster shares them out while a batch still reads and writes them in
  256 multi-key commands (pipelined, one round trip per node) rather than one per key.
* **Atomic writes across slots** (a redo record). Redis Cluster has no transaction
  across slots, so :meth:`RedisBackend.apply` first stores the whole write as one value
  in the own slot (``!redo``), then applies it, then deletes it. Every value written is
  the key's full new value, so applying a write twice is the same as once: whoever next
  takes the lease (or opens the index) finds a redo record left by a crash and applies it
  before reading anything. After a crash a write is therefore all visible or, once
  recovered, all visible: never half.
* **The lease** (:meth:`RedisBackend.exclusive`). Instances decide and store one batch at
  a time: ``SET !lock <token> NX PX <ttl>``. The redo record is written by a script that
  first checks the token (and extends the lease), so an instance whose lease expired
  (paused past ``lock_ttl_ms``) cannot start a write over a newer holder's. A killed
  holder's lease expires after ``lock_ttl_ms``.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import redis
from redis.cluster import RedisCluster

from stream_dedup.errors import IndexUnreachableError
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.keys import SCOPED

__all__ = ["DEFAULT_NAMESPACE", "RedisBackend", "redacted"]

DEFAULT_NAMESPACE = "stream-dedup"
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Hash tags of the records' 256 slots.
_TAGS = [b"{%02x}" % i for i in range(256)]
#: Keys per MGET / MSET command: long enough to amortise a command, short enough not to
#: stall a Redis node (single-threaded) for other clients.
_CHUNK = 1000
_GLOB = re.compile(rb"([*?\[\]\\])")

#: Stores the redo record only while ``token`` still holds the lease, and extends it.
_FENCED_REDO = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASE lost: another instance holds the index')
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""
#: Releases the lease only if ``token`` holds it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class _Write(NamedTuple):
    """A prepared write: Redis keys and values by hash slot group, and the redo record."""

    epoch: int
    groups: dict[bytes, tuple[list[bytes], list[bytes]]]
    redo: bytes


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def _encode_redo(epoch: int, keys: list[bytes], values: list[bytes]) -> bytes:
    """One value holding a write: epoch, count, key and value lengths, keys, values."""
    klen = np.fromiter(map(len, keys), dtype="<u4", count=len(keys))
    vlen = np.fromiter(map(len, values), dtype="<u4", count=len(values))
    head = np.array([epoch, len(keys)], dtype="<u8").tobytes()
    return b"".join((head, klen.tobytes(), vlen.tobytes(), b"".join(keys), b"".join(values)))


def _decode_redo(blob: bytes) -> tuple[int, list[bytes], list[bytes]]:
    epoch, n = (int(x) for x in np.frombuffer(blob, dtype="<u8", count=2))
    klen = np.frombuffer(blob, dtype="<u4", count=n, offset=16).astype(np.int64)
    vlen = np.frombuffer(blob, dtype="<u4", count=n, offset=16 + 4 * n).astype(np.int64)
    at = 16 + 8 * n
    kend = at + np.cumsum(klen)
    vend = int(kend[-1]) + np.cumsum(vlen) if n else kend
    kstart, vstart = (kend - klen).tolist(), (vend - vlen).tolist()
    keys = [blob[a:b] for a, b in zip(kstart, kend.tolist(), strict=True)]
    values = [blob[a:b] for a, b in zip(vstart, vend.tolist(), strict=True)]
    return epoch, keys, values


class RedisBackend:
    """An index on Redis at ``url`` (``redis://`` or ``rediss://`` for TLS; a cluster is
    recognised from the server), under ``namespace`` so that several indexes can share
    one Redis. ``lock_ttl_ms`` bounds how long a killed instance's lease blocks the
    others."""

    #: Other processes write this index while it is open: nothing read may be cached
    #: across :meth:`exclusive` sections.
    shared: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        password: str | None = None,
        tls_ca_file: str | None = None,
        lock_ttl_ms: int = 10_000,
        timeout_s: float = 10.0,
    ) -> None:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"Redis namespace {namespace!r}: use 1 to 64 of A-Z a-z 0-9 _ . -")
        self._url = url
        self._location = f"{redacted(url)} (namespace {namespace})"
        self._client = self._connect(url, password, tls_ca_file, timeout_s)
        self.cluster = isinstance(self._client, RedisCluster)
        ns = namespace.encode()
        self._own = b"{" + ns + b"}:"
        self._lock = b"{" + ns + b"}!lock"
        self._redo = b"{" + ns + b"}!redo"
        self._epoch_set = b"{" + ns + b"}!epochs"
        self._records = ns + b":"
        self._lock_ttl_ms = lock_ttl_ms
        self._token: bytes | None = None
        self._writes = 0
        self._fenced_redo = self._client.register_script(_FENCED_REDO)
        self._release = self._client.register_script(_RELEASE)
        with self.exclusive():  # finishes a write a crash left half done
            pass

    def _connect(
        self, url: str, password: str | None, ca: str | None, timeout_s: float
    ) -> redis.Redis | RedisCluster:
        options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        if password:
            options["password"] = password
        if ca:
            options["ssl_ca_certs"] = ca
        try:
            probe = redis.Redis.from_url(url, **options)
            try:
                info = probe.info("cluster")
            finally:
                probe.close()
            if info.get("cluster_enabled"):
                return RedisCluster.from_url(url, **options)
            return redis.Redis.from_url(url, **options)
        except (redis.RedisError, OSError, ValueError) as exc:
            raise IndexUnreachableError(self._location, "connecting", str(exc)) from exc

    @property
    def location(self) -> str:
        return self._location

    # -- keys ---------------------------------------------------------------------------

    def _grouped(
        self, keys: Sequence[bytes], values: Sequence[bytes] | None, epoch: int
    ) -> dict[bytes, tuple[list[bytes], list[Any]]]:
        """Redis keys (and their values, or their positions) by slot group (``b""``: the
        own slot). A record goes to ``epoch``; an own key ignores it."""
        groups: dict[bytes, tuple[list[bytes], list[Any]]] = {}
        second: Sequence[Any] = range(len(keys)) if values is None else values
        records, own, tags, crc = self._records + b"%d:" % epoch, self._own, _TAGS, zlib.crc32
        for key, other in zip(keys, second, strict=True):
            if key[0] in SCOPED:
                group = tags[crc(key) & 255]
                rkey = records + group + key
            else:
                group, rkey = b"", own + key
            entry = groups.get(group)
            if entry is None:
                entry = groups[group] = ([], [])
            entry[0].append(rkey)
            entry[1].append(other)
        return groups

    # -- reads --------------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        if not keys:
            return []
        if epoch and any(key[0] not in SCOPED for key in keys):
            raise ValueError("only keys that belong to an epoch are read from one")
        groups = self._grouped(keys, None, epoch)
        out: list[bytes | None] = [None] * len(keys)
        places: list[list[int]] = []
        with self._failing("reading"):
            pipe = self._client.pipeline(transaction=False)
            for rkeys, positions in groups.values():
                for start in range(0, len(rkeys), _CHUNK):
                    pipe.execute_command("MGET", *rkeys[start : start + _CHUNK])
                    places.append(positions[start : start + _CHUNK])
            for where, found in zip(places, pipe.execute(), strict=True):
                for i, value in zip(where, found, strict=True):
                    out[i] = value
        return out

    def scan_prefix(self, prefix: bytes, epoch: int = 0) -> Iterator[tuple[bytes, bytes]]:
        found = list(self.scan_keys(prefix, epoch))
        for start in range(0, len(found), 10 * _CHUNK):
            part = found[start : start + 10 * _CHUNK]
            values = self.get_many(part, epoch)
            for key, value in zip(part, values, strict=True):
                if value is not None:  # deleted since the scan
                    yield key, value

    def scan_keys(self, prefix: bytes, epoch: int = 0) -> Iterator[bytes]:
        """Keys by ``SCAN`` (every node of a cluster), then sorted: a whole-keyspace walk,
        for start-up and maintenance, never on a batch's path."""
        escaped = _GLOB.sub(rb"\\\1", prefix)
        patterns: list[tuple[bytes, int]] = [
            (self._records + b"%d:{??}" % epoch + escaped + b"*", len(self._records) + 1)
        ]
        if epoch == 0:
            patterns.append((self._own + escaped + b"*", 0))
        found: list[bytes] = []
        with self._failing("scanning"):
            for pattern, _ in patterns:
                for rkey in self._client.scan_iter(match=pattern, count=5000):
                    found.append(self._index_key(rkey))
        found.sort()
        yield from found

    def _index_key(self, rkey: bytes) -> bytes:
        if rkey.startswith(self._own):
            return rkey[len(self._own) :]
        return rkey[rkey.index(b"}") + 1 :]  # <namespace>:<epoch>:{tag}<key>

    def epochs(self) -> list[int]:
        with self._failing("reading the epochs"):
            members = self._client.smembers(self._epoch_set)
        return sorted({0, *(int(m) for m in members)})

    # -- writes -------------------------------------------------------------------------

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        if puts and all(key[0] not in SCOPED for key in puts):
            # The own keys share one slot: one MSET is atomic without a redo record.
            with self._failing("writing"):
                self._client.mset({self._own + k: v for k, v in puts.items()})
            self._writes += 1
            return
        self.apply(self.prepare(puts))

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        epoch: int = 0,
    ) -> _Write:
        keys = [*puts, *ordered.keys]
        values = [*puts.values(), *ordered.values]
        groups = self._grouped(keys, values, epoch)
        rkeys = [k for g in groups.values() for k in g[0]]
        rvalues = [v for g in groups.values() for v in g[1]]
        return _Write(epoch, groups, _encode_redo(epoch, rkeys, rvalues))

    def apply(self, prepared: _Write) -> None:
        with self._failing("writing"):
            if self._token is not None:
                self._fenced_redo(
                    keys=[self._lock, self._redo],
                    args=[self._token, prepared.redo, self._lock_ttl_ms],
                )
            else:
                self._client.set(self._redo, prepared.redo)
            self._put(prepared.epoch, prepared.groups)
            self._client.delete(self._redo)
        self._writes += 1

    def _put(self, epoch: int, groups: Mapping[bytes, tuple[list[bytes], list[bytes]]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        if epoch:
            pipe.sadd(self._epoch_set, epoch)
        for rkeys, values in groups.values():
            for start in range(0, len(rkeys), _CHUNK):
                end = start + _CHUNK
                pipe.execute_command(
                    "MSET",
                    *[
                        x
                        for kv in zip(rkeys[start:end], values[start:end], strict=True)
                        for x in kv
                    ],
                )
        pipe.execute()

    def _recover(self) -> None:
        """Apply a write that a crash left between its redo record and its end."""
        with self._failing("recovering an interrupted write"):
            blob = self._client.get(self._redo)
            if not isinstance(blob, bytes):
                return
            epoch, rkeys, values = _decode_redo(blob)
            groups: dict[bytes, tuple[list[bytes], list[bytes]]] = {}
            for rkey, value in zip(rkeys, values, strict=True):
                group = b"" if rkey.startswith(self._own) else rkey[rkey.index(b"{") :][:4]
                entry = groups.setdefault(group, ([], []))
                entry[0].append(rkey)
                entry[1].append(value)
            self._put(epoch, groups)
            self._client.delete(self._redo)

    def drop_epoch(self, epoch: int) -> None:
        """Delete the records of ``epoch``: a ``SCAN`` of the keyspace and ``UNLINK`` in
        batches (Redis has no range delete), done after the commit that let it go."""
        pattern = self._records + b"%d:{??}*" % epoch
        with self._failing("dropping an epoch"):
            batch: dict[bytes, list[bytes]] = {}
            pipe = self._client.pipeline(transaction=False)
            for rkey in self._client.scan_iter(match=pattern, count=5000):
                group = rkey[rkey.index(b"{") :][:4]
                batch.setdefault(group, []).append(rkey)
                if len(batch[group]) >= _CHUNK:
                    pipe.execute_command("UNLINK", *batch.pop(group))
            for rkeys in batch.values():
                pipe.execute_command("UNLINK", *rkeys)
            if epoch:
                pipe.srem(self._epoch_set, epoch)
            pipe.execute()

    # -- the lease ----------------------------------------------------------------------

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the index's lease: no other instance decides or writes meanwhile.

        Waits for the holder to release it or for its lease to expire, then applies a
        write a crash left unfinished, so what is read inside is a whole state.
        """
        if self._token is not None:
            raise RuntimeError("the lease is already held")
        token = uuid.uuid4().hex.encode()
        pause = 0.0005
        with self._failing("taking the lease"):
            while not self._client.set(self._lock, token, nx=True, px=self._lock_ttl_ms):
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
        self._token = token
        try:
            self._recover()
            yield
        finally:
            self._token = None
            with contextlib.suppress(redis.RedisError, OSError):
                self._release(keys=[self._lock], args=[token])

    # -- the rest of the contract -------------------------------------------------------

    def size_bytes(self) -> int:
        """Memory used by the Redis servers (every node of a cluster): Redis reports no
        figure per key prefix, so this counts whatever else the servers hold too."""
        with self._failing("reading memory use"):
            if isinstance(self._client, RedisCluster):
                nodes = self._client.info("memory", target_nodes=RedisCluster.PRIMARIES)
                return sum(int(node["used_memory"]) for node in nodes.values())
            return int(self._client.info("memory")["used_memory"])

    def sidecar(self, name: str) -> Path | None:
        return None

    def sequence(self) -> int:
        return self._writes

    def close(self) -> None:
        self._client.close()

    @contextlib.contextmanager
    def _failing(self, operation: str) -> Iterator[None]:
        try:
            yield
        except (redis.RedisError, OSError) as exc:
            raise IndexUnreachableError(self._location, operation, str(exc)) from exc
