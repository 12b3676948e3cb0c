"""The one door to an index: :func:`open_index` opens it in memory, in a RocksDB directory
or on Redis, with its parameters and retention given at opening.

Every caller (the service, the command line, the Python API, snapshots) opens an index
here, so the rules of opening live in one place: which backend a location names, what an
absent index is, and how retention options meet the retention an index stores. No caller
knows which backend it got (datasketch's ``ordered_storage(config)`` is the pattern).

A backend's client library is imported when an index on it is opened, not before:
importing this module loads neither the RocksDB binding nor the Redis client, so a command
that never opens a RocksDB (or Redis) index never pays for loading one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stream_dedup.core.config import DedupConfig
from stream_dedup.errors import IndexMismatchError, IndexStoreError
from stream_dedup.index.backend import Backend
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_layout import DEFAULT_NAMESPACE
from stream_dedup.index.retention import Retention, RetentionChange
from stream_dedup.index.store import DedupIndex

if TYPE_CHECKING:
    from stream_dedup.index.follower import FollowerIndex
    from stream_dedup.index.rocks import RocksBackend

__all__ = [
    "DEFAULT_NAMESPACE",
    "Location",
    "RedisSettings",
    "holds_database",
    "open_follower",
    "open_index",
    "open_or_create",
    "open_rocks",
]


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """A shared index on Redis (one node or a Redis Cluster, recognised from the server).

    ``url`` is ``redis://host:port/db`` (``rediss://`` for TLS, ``tls_ca_file`` the CA to
    trust); ``namespace`` prefixes every key, so several indexes can share one Redis;
    ``lock_ttl_ms`` is how long an instance killed while holding the index's lease blocks
    the others (see :mod:`stream_dedup.index.redis_backend`).
    """

    url: str
    namespace: str = DEFAULT_NAMESPACE
    password: str | None = None
    tls_ca_file: str | None = None
    lock_ttl_ms: int = 10_000


#: Where an index lives: ``None`` for a fresh one in memory, a directory for RocksDB, or
#: :class:`RedisSettings` for the shared index on Redis.
Location = str | os.PathLike[str] | RedisSettings | None


def open_index(
    where: Location,
    params: IndexParams | None,
    *,
    retention: Retention | RetentionChange | None = None,
    sync: bool = False,
    read_only: bool = False,
) -> DedupIndex:
    """Open (or create) the index at ``where`` (see :data:`Location`).

    ``params=None`` opens an existing index with the parameters it stores; without them
    there is nothing to create one with, so a location that holds no index is an
    :class:`~stream_dedup.errors.IndexStoreError` that says how to make one (and a
    directory is left as it was). Given, they must equal the stored ones (else
    :class:`~stream_dedup.errors.IndexMismatchError`) and create the index when there is
    none. ``retention`` is in force from the first batch: ``None`` keeps what the index
    stores, a :class:`RetentionChange` changes part of it; it cannot be changed once the
    index is open. ``sync`` fsyncs every RocksDB commit (surviving a machine crash, at one
    fsync per batch). ``read_only`` opens a RocksDB index as a frozen view that takes no
    lock (for reading while the service writes it, or from a read-only directory); it
    must exist, and nothing may be written through it.
    """
    backend: Backend
    if where is None:
        backend = MemoryBackend()
    elif isinstance(where, RedisSettings):
        backend = _redis_backend(where)
    else:
        backend = open_rocks(
            where,
            sync=sync,
            read_only=read_only,
            must_exist=params is None or read_only,
        )
    return DedupIndex(backend, params, retention)


def _redis_backend(where: RedisSettings) -> Backend:
    """A client of the shared index ``where`` names (imported here: Redis is optional)."""
    from stream_dedup.index.redis_backend import RedisBackend

    return RedisBackend(
        where.url,
        namespace=where.namespace,
        password=where.password,
        tls_ca_file=where.tls_ca_file,
        lock_ttl_ms=where.lock_ttl_ms,
    )


def open_follower(where: Location) -> FollowerIndex:
    """The index at ``where``, which another process writes, opened to follow its commits
    (:class:`~stream_dedup.index.follower.FollowerIndex`: a RocksDB secondary instance,
    or a Redis client of its own). It must exist."""
    from stream_dedup.index.follower import FollowerIndex

    backend: Backend
    if where is None:
        raise ValueError("an index in memory has no other process to follow")
    if isinstance(where, RedisSettings):
        backend = _redis_backend(where)
    else:
        if not holds_database(where):
            raise IndexStoreError(f"{where} holds no index to follow")
        from stream_dedup.index.rocks import RocksBackend

        backend = RocksBackend(Path(where), secondary=True)
    return FollowerIndex(backend)


def open_or_create(
    where: Location,
    choose: Callable[[DedupConfig | None], DedupConfig],
    *,
    retention: Retention | RetentionChange | None = None,
    sync: bool = False,
) -> tuple[DedupIndex, DedupConfig]:
    """Open the index at ``where`` with the detector configuration ``choose`` settles, or
    create it with that configuration; the index and the configuration.

    ``choose`` is given the configuration the index stores (``None`` when there is no
    index yet, before anything is created: an invalid choice leaves nothing behind) and
    returns the one to use, as the command line's flags and the Python API's parameters
    override stored values. A choice whose stored parameters differ from the index's is
    an :class:`~stream_dedup.errors.IndexMismatchError` naming each difference. On Redis
    the index must exist (the service creates it). Other arguments: :func:`open_index`.
    """
    if where is None or (not isinstance(where, RedisSettings) and not holds_database(where)):
        chosen = choose(None)
        return open_index(where, IndexParams.of(chosen), retention=retention, sync=sync), chosen
    index = open_index(where, None, retention=retention, sync=sync)
    try:
        stored = index.params
        chosen = choose(stored.dedup_config())
        wanted = IndexParams.of(chosen)
        if wanted != stored:
            raise IndexMismatchError(index.location, stored.differences(wanted))
    except BaseException:
        index.close()
        raise
    return index, chosen


def open_rocks(
    path: str | os.PathLike[str],
    *,
    sync: bool = False,
    read_only: bool = False,
    must_exist: bool = False,
) -> RocksBackend:
    """The RocksDB backend at ``path``, for what works on a database's keys as they are
    (snapshots and restores copy them whole); deciding documents opens an index with
    :func:`open_index`, which comes here for a directory.

    ``read_only`` (a frozen view that takes no lock, readable while another process
    writes) and ``must_exist`` need a database there already: a directory without one is
    an :class:`~stream_dedup.errors.IndexStoreError` naming the path and how to create an
    index, rather than an empty database created in its place.
    """
    where = Path(path)
    if (read_only or must_exist) and not holds_database(where):
        raise IndexStoreError(
            f"{where} holds no index: create one with `stream-dedup dedup --index {where}` "
            "(or start the service with index.path there), or check the path"
        )
    from stream_dedup.index.rocks import RocksBackend

    return RocksBackend(where, sync=sync, read_only=read_only)


def holds_database(path: str | os.PathLike[str]) -> bool:
    """Whether a RocksDB database is at ``path`` (its ``CURRENT`` file names the live
    manifest, and exists from the moment a database is created)."""
    return (Path(path) / "CURRENT").exists()
