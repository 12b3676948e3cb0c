"""The index on Redis (one node or a Redis Cluster), shared by many service instances.

The :class:`~stream_dedup.index.backend.Backend` contract over Redis, plus what sharing
needs (the protocol is in ``docs/shared-index.md``):

* **Where keys live.** The index's own keys (parameters, counters, offsets, the epoch
  table) are plain keys in one hash slot, ``{<namespace>}:<key>``, so a write of several
  of them is one atomic ``MSET``. The records of documents
  (:data:`~stream_dedup.index.keys.SCOPED`) are fields of 256 hashes per epoch,
  ``<namespace>:<epoch>:{<tag>}``, the tag being a byte of the key that is already
  uniform (the last byte of a band hash, digest or docnum; the CRC-32 of an id). A
  cluster shares the 256 hashes out over its shards, a batch reads and writes them in
  256 pipelined ``HMGET``/``HSET`` commands rather than one command per key, and an
  expired epoch goes by unlinking its 256 hashes (Redis frees them in the background).
* **Atomic writes across slots** (a redo record). Redis Cluster has no transaction
  across slots, so :meth:`RedisBackend.apply` first stores the write as one value in
  the own slot (``!redos``, versioned), then applies it, then deletes it. Every value
  written is the field's full new value, so applying a write twice is the same as once:
  the next lease reads through a redo record not applied yet, and the next write (or
  opening the index) applies it. The whole write, document records included, is in the
  redo record: the commit point is one script and one round trip, nothing before it.
* **The lease** (:meth:`RedisBackend.exclusive`). Instances decide and store one batch at
  a time: ``SET !lock <token> NX PX <ttl>``. The commit point's script checks the token,
  so an instance whose lease expired (paused past ``lock_ttl_ms``) writes nothing. A
  killed holder's lease expires after ``lock_ttl_ms``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import redis
from redis.cluster import RedisCluster

from stream_dedup.core.hashing import U64
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.keys import SCOPED
from stream_dedup.index.redis_applier import Applier
from stream_dedup.index.redis_client import connect, failing
from stream_dedup.index.redis_heads import GroupHeads
from stream_dedup.index.redis_layout import (
    DEFAULT_NAMESPACE,
    READ_CHUNK,
    RedisLayout,
    redacted,
)
from stream_dedup.index.redis_log import (
    LOG_ENTRIES,
    PEEK,
    READ,
    TAKE,
    ChangeCursor,
    Changes,
)
from stream_dedup.index.redis_members import widen_buckets
from stream_dedup.index.redis_overlay import Overlay
from stream_dedup.index.redis_prepare import Write, prepare_records, prepare_write
from stream_dedup.index.redis_redo import COMMIT, FOLLOW, RedoQueue
from stream_dedup.index.redis_wire import Wire

__all__ = ["DEFAULT_NAMESPACE", "RedisBackend", "redacted"]

#: Releases the lease only if ``token`` holds it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


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
        self._keys = layout = RedisLayout(namespace)  # a bad namespace is a ValueError here
        self._url = url
        self._location = f"{redacted(url)} (namespace {namespace})"
        self._client = connect(url, self._location, password, tls_ca_file, timeout_s)
        self.cluster = isinstance(self._client, RedisCluster)
        self._own, self._lock, self._redos = layout.own, layout.lock, layout.redos
        self._epoch_set = layout.epoch_set
        self._log_keys = [layout.version, layout.log]
        self._cursor = ChangeCursor()
        self._lock_ttl_ms = lock_ttl_ms
        self._token: bytes | None = None
        #: A lease this instance could not release (Redis was unreachable): released at
        #: the next :meth:`exclusive`, so that a retry after an outage does not wait
        #: ``lock_ttl_ms`` for this instance's own lease to expire.
        self._unreleased: bytes | None = None
        self._writes = 0
        #: The index's version the current read-through stands at (-1: none): inside
        #: :meth:`exclusive` and :meth:`as_of`, writes up to it are read through.
        self._read_version = -1
        self._release = self._client.register_script(_RELEASE)
        self._wire = Wire(self._client)
        self._queue = RedoQueue(self._client, self._wire, layout)
        self._applier = Applier(self._queue, self._epoch_set, self._failing)
        #: The redo records waiting when the lease was taken, read through inside it.
        self._overlay = Overlay()
        #: When this instance's last write released the lease (its commit point), for
        #: the lease's held time; None while it holds the lease or wrote outside one.
        self.released_at: float | None = None
        self._take = self._client.register_script(TAKE)
        self._peek = self._client.register_script(PEEK)
        self._commit = self._client.register_script(COMMIT)
        self._read_log = self._client.register_script(READ)
        self._follow = self._client.register_script(FOLLOW)
        with self.exclusive(), self._failing("recovering an interrupted write"):
            self._queue.recover(self._epoch_set)  # the writes a crash left half done

    @property
    def location(self) -> str:
        return self._location

    # -- reads --------------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        if not keys:
            return []
        if epoch and any(key[0] not in SCOPED for key in keys):
            raise ValueError("only keys that belong to an epoch are read from one")
        self._reading()
        out: list[bytes | None] = [None] * len(keys)
        # A value waiting in a redo record (inside a lease) is newer than the stored one:
        # only the keys it does not hold are read.
        filled = self._overlay.fill(epoch, keys, out) if self._overlay else ()
        wanted = [i for i in range(len(keys)) if i not in filled] if filled else None
        asked = keys if wanted is None else [keys[i] for i in wanted]
        commands, places = self._keys.reads(asked, epoch)
        if wanted is not None:  # positions in ``asked`` -> positions in ``keys``
            places = [[wanted[i] for i in where] for where in places]
        with self._failing("reading"):
            for where, found in zip(places, self._wire.run(commands), strict=True):
                for i, value in zip(where, found, strict=True):
                    out[i] = value
        widen_buckets(keys, out)
        return out

    def scan_prefix(self, prefix: bytes, epoch: int = 0) -> Iterator[tuple[bytes, bytes]]:
        found = list(self.scan_keys(prefix, epoch))
        for start in range(0, len(found), 10 * READ_CHUNK):
            part = found[start : start + 10 * READ_CHUNK]
            values = self.get_many(part, epoch)
            for key, value in zip(part, values, strict=True):
                if value is not None:  # deleted since the scan
                    yield key, value

    def scan_keys(self, prefix: bytes, epoch: int = 0) -> Iterator[bytes]:
        """Keys by ``HSCAN`` of the epoch's hashes and ``SCAN`` of the own keys (only the
        side ``prefix`` can live on: :meth:`RedisLayout.scan`), then sorted: a walk of
        the whole epoch, for start-up, partition assignment and maintenance, never on a
        batch's path."""
        self._reading()
        with self._failing("scanning"):
            found = self._keys.scan(self._client, prefix, epoch)
        yield from found

    def epochs(self) -> list[int]:
        self._reading()
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
        self.wait_applied()

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        epoch: int = 0,
        changed: U64 | None = None,
    ) -> Write:
        """The write of ``puts`` and ``ordered`` (band buckets in key order) as the redo
        record its commit point stores, document records included; it is grouped by
        hash when applied, after the lease (:mod:`.redis_prepare`)."""
        return prepare_write(puts, ordered, epoch, changed)

    prepare_records = staticmethod(prepare_records)  # the records kept kind by kind

    def apply(self, prepared: Write, committed: Callable[[], None] | None = None) -> None:
        """Store ``prepared``: the commit point (one script: checks the lease, stores the
        write as its redo record, frees the lease), ``committed``, then the writes waiting,
        each hash in version order (:mod:`.redis_redo`), on the applier thread: the write
        is whole at its commit point (every reader reads through a record not applied
        yet), so the batch goes on meanwhile. Nothing without the lease."""
        with self._failing("writing"):
            version, waiting = self.commit_point(prepared)
            self._queue.keep(version, prepared.redo, prepared.rest)
        if committed is not None:
            committed()
        self._cursor.own(version)  # its keys reach the filter with the write (DedupIndex)
        self._writes += 1
        self._applier.submit(version, waiting)

    def warm_up(self) -> None:
        """Load the applier thread's compiled loop now, on that thread (the service's
        warm-up: :meth:`.Applier.warm_up`)."""
        self._applier.warm_up()

    @property
    def apply_failures(self) -> int:
        """Writes whose apply after the commit point failed (their records waited)."""
        return self._applier.failures

    def wait_applied(self) -> None:
        """Return once this instance's writes are applied to the record hashes
        (:mod:`.redis_applier`); an apply that failed is finished here or raises."""
        self._applier.wait()

    def after_applied(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) once the writes made so far are applied."""
        self._applier.after(callback)

    def _reading(self) -> None:
        """Before a read of the hashes: wait for own writes its overlay does not cover."""
        if self._applier.pending_after(self._read_version):
            self._applier.wait()

    def commit_point(self, prepared: Write) -> tuple[int, list[int]]:
        """The one script of :meth:`apply` inside the lease (:data:`.redis_redo.COMMIT`):
        the write's version and the versions waiting to be applied (this one among
        them). The lease is let go; nothing of the write is applied yet."""
        token = self._token or b""
        keys = [self._lock, self._redos, *self._log_keys, self._epoch_set]
        args: list[bytes | int] = [token, self._lock_ttl_ms, prepared.redo, prepared.entry]
        version, *waiting = self._commit(keys=keys, args=[*args, LOG_ENTRIES, prepared.epoch])
        if token:
            self._token, self.released_at = None, time.perf_counter()
        return int(version), [int(v) for v in waiting]

    def drop_epoch(self, epoch: int) -> None:
        """Delete the records of ``epoch``: its 256 hashes, unlinked (Redis frees them in
        the background)."""
        self.wait_applied()  # a write applied after the drop would bring hashes back
        with self._failing("dropping an epoch"):
            pipe = self._client.pipeline(transaction=False)
            for tag in range(256):
                pipe.unlink(self._keys.hash(epoch, tag))
            if epoch:
                pipe.srem(self._epoch_set, epoch)
            pipe.execute()

    def claim(self, name: bytes, ttl_ms: int) -> bool:
        """``SET NX PX``: the first instance to ask holds the claim until it expires."""
        token = uuid.uuid4().hex.encode()
        with self._failing("taking a claim"):
            return bool(self._client.set(self._own + name, token, nx=True, px=ttl_ms))

    # -- the lease ----------------------------------------------------------------------

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the index's lease: no other instance decides or writes meanwhile.

        Waits for the holder to release it or for its lease to expire, then reads
        through the writes that passed their commit point but are not applied yet (a
        holder before applies its write after releasing the lease; a crash may have cut
        one short), so what is read inside is a whole state. A write inside releases
        the lease at its commit point (:meth:`apply`).
        """
        if self._token is not None:
            raise RuntimeError("the lease is already held")
        token = uuid.uuid4().hex.encode()
        pause = 0.0005
        with self._failing("taking the lease"):
            if self._unreleased is not None:
                self._release(keys=[self._lock], args=[self._unreleased])
                self._unreleased = None
            if self._cursor.at is not None:  # most of the log, read before the wait
                self._cursor.read(self._read_log(keys=self._log_keys, args=[self._cursor.at]))
            taken_keys = [self._lock, self._redos, *self._log_keys]
            while True:
                args: list[bytes | int] = [token, self._lock_ttl_ms, self._cursor.position]
                taken = self._take(keys=taken_keys, args=args)
                if taken:
                    break
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
        self._token, self.released_at = token, None
        try:
            waiting, *since = taken
            self._cursor.read(since)
            with self._failing("reading the writes not applied yet"):
                self._overlay = self._queue.overlay([int(v) for v in waiting])
            self._read_version = int(since[0])
            yield
        finally:
            self._overlay = Overlay()  # outside the lease, newer writes may be applied
            self._read_version = -1
            if self._token is not None:  # not released by a write's commit point
                self._token = None
                try:
                    self._release(keys=[self._lock], args=[token])
                except (redis.RedisError, OSError):
                    self._unreleased = token

    @contextlib.contextmanager
    def as_of(self) -> Iterator[int]:
        """Read as of the version now, outside the lease: the writes waiting at it read
        through, the log read up to it (one script; see ``dedup/predecide.py``)."""
        if self._token is not None:
            raise RuntimeError("the lease is held: read inside it")
        with self._failing("reading the index's version"):
            keys, at = [self._redos, *self._log_keys], [self._cursor.position]
            waiting, *since = self._peek(keys=keys, args=at)
            self._cursor.read(since)
            self._overlay = self._queue.overlay([int(v) for v in waiting])
        self._read_version = int(since[0])
        try:
            yield int(since[0])
        finally:
            self._overlay = Overlay()
            self._read_version = -1

    # -- the change log (ChangeFeed) ----------------------------------------------------

    @property
    def following(self) -> bool:
        return self._cursor.at is not None

    def follow_changes(self) -> None:
        """Start following the log where the filters about to be built from a scan will
        stand: before the oldest write not applied yet (the scan cannot see its keys)."""
        with self._failing("reading the change log"):
            version, *waiting = self._follow(keys=[self._log_keys[0], self._redos])
        self._cursor.follow(min([int(version or 0), *(int(v) - 1 for v in waiting)]))

    def changes(self) -> Changes | None:
        return self._cursor.drain()

    def group_heads(self, scope: str) -> GroupHeads:
        """The heads ``scope`` (a consumer group) shares on this index: the group-wide time
        order of ``docs/group-order.md``, beside the lease rather than in it."""
        return GroupHeads(self._client, self._own[:-1], scope, self._location)

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
        """Finish the writes being applied, then close every connection now: a cluster
        client's ``close`` leaves its node clients' pools open until the GC finds them."""
        self._applier.close()
        if isinstance(self._client, RedisCluster):
            self._client.disconnect_connection_pools()  # type: ignore[no-untyped-call]
        self._client.close()

    def _failing(self, operation: str) -> contextlib.AbstractContextManager[None]:
        return failing(self._location, operation)
