"""The key-value contract the three index backends implement (memory, RocksDB, Redis).

Deliberately narrow (batched reads, one atomic write, prefix scan) so that the
implementations are interchangeable and tested by one suite, and so that all
layout and decision logic lives above it, once.

The atomic write comes in two halves, :meth:`Backend.prepare` and :meth:`Backend.apply`:
preparing a batch's write (ordering ~40,000 keys and copying them into a RocksDB
``WriteBatch``) is most of its cost and changes nothing, so the service prepares while the
broker acknowledges the batch's events, and applies only once they are confirmed.

Records that belong to a document (the kinds of :data:`stream_dedup.index.keys.SCOPED`) live
in an *epoch* (:mod:`stream_dedup.index.retention`), named by the ``epoch`` argument; the
index's own keys ignore it. An epoch is dropped whole (:meth:`Backend.drop_epoch`), which
is what makes retention cheap: a backend keeps each epoch apart so that dropping one
costs nothing per key.

A *shared* backend (Redis: :mod:`stream_dedup.index.redis_backend`) is written by several
processes at once. They take turns through :meth:`Backend.exclusive`, and whatever one
read before its turn may be stale inside it; the others have one writer and their
``exclusive`` does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U64

#: A write built by :meth:`Backend.prepare`, opaque to everything but its backend.
PreparedWrite = Any


class OrderedPuts(NamedTuple):
    """Puts in ascending key order, as parallel lists of keys and values.

    Not a list of pairs: a batch writes ~30,000 band buckets this way, and a tuple per
    bucket would be one more object per bucket to build, then to free.
    """

    keys: Sequence[bytes]
    values: Sequence[bytes]
    #: The same puts as arrays, when the caller has them (band buckets): see
    #: :class:`BucketArrays`.
    arrays: BucketArrays | None = None


class BucketArrays(NamedTuple):
    """Band buckets' puts as arrays: the keys joined (11 bytes each, in key order), each
    key's number of members, and the members' docnums one key after another, as the
    values hold them. A backend that stores buckets in its own encoding (Redis) builds
    its bytes from these in a few array operations instead of a Python step per key."""

    keys: bytes
    counts: npt.NDArray[np.int64]
    members: U64


#: No ordered puts.
NO_ORDERED_PUTS = OrderedPuts((), ())


class Backend(Protocol):
    """An ordered byte-key store with atomic batch writes."""

    #: Whether other processes write the store while this one has it open.
    shared: ClassVar[bool]

    @property
    def location(self) -> str:
        """Where the data lives (a path, or ``":memory:"``), for messages."""
        ...

    def get_many(self, keys: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        """Values for ``keys`` in order, ``None`` where absent (one batched read); with an
        ``epoch`` other than 0, ``keys`` are records of that epoch only."""
        ...

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        """Apply all ``puts`` atomically: after a crash either all are visible or none."""
        ...

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        epoch: int = 0,
        changed: U64 | None = None,
    ) -> PreparedWrite:
        """Build the atomic write of ``puts`` without applying it (nothing becomes visible);
        the records that belong to an epoch go to ``epoch``.

        ``ordered`` are more puts, already in ascending key order and with no key of
        ``puts``: the band buckets, most of a batch's keys, which need no sorting.

        ``puts`` may not change until the write is applied.

        ``changed`` are the key-filter fingerprints of the look-up keys the write holds
        (:func:`~stream_dedup.index.pending.written_fingerprints`). A shared backend
        publishes them with the write, so that the other instances' key filters learn
        its keys (``None``: unknown, their filters are rebuilt); the others ignore them.
        """
        ...

    def apply(self, prepared: PreparedWrite, committed: Callable[[], None] | None = None) -> None:
        """Apply a prepared write atomically, as :meth:`write` would; once only.

        ``committed`` is called once the write is at its commit point (every reader sees
        it whole from then on), before whatever work the backend still does for it: a
        shared index hands the group's turn over there (``docs/group-order.md``)."""
        ...

    def scan_prefix(self, prefix: bytes, epoch: int = 0) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in key order: of epoch 0
        and the index's own keys, or of the records of another ``epoch``."""
        ...

    def scan_keys(self, prefix: bytes, epoch: int = 0) -> Iterator[bytes]:
        """Every key that starts with ``prefix``, in key order (values not read), as
        :meth:`scan_prefix` selects them."""
        ...

    def epochs(self) -> list[int]:
        """The epochs that have records stored (0 always), ascending."""
        ...

    def drop_epoch(self, epoch: int) -> None:
        """Delete every record of ``epoch``, in bulk."""
        ...

    def size_bytes(self) -> int:
        """Approximate bytes used (on disk for RocksDB, in memory for the dict)."""
        ...

    def sidecar(self, name: str) -> Path | None:
        """Where a file derived from the data may be kept beside it (``None``: nowhere,
        e.g. in memory or in a read-only view). Such a file is a cache: never the only
        copy of anything."""
        ...

    def claim(self, name: bytes, ttl_ms: int) -> bool:
        """Whether this process now holds the claim ``name`` (an index's own key, see
        :data:`~stream_dedup.index.keys.CLAIM`): taken when no other holds it, then held
        for ``ttl_ms`` by this caller alone, and free again after it, whether or not its
        holder finished (one that died frees it so). What one instance of a shared index
        does for all of them once (training the payload dictionary) is claimed first;
        a store one process alone writes gives every claim to it."""
        ...

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Hold the store against the other writers of a shared store for one
        read-decide-write; reads inside see a whole state (never half a write)."""
        ...

    def sequence(self) -> int:
        """A number that changes with every write (RocksDB's write sequence number): what
        a sidecar file was derived from."""
        ...

    def close(self) -> None:
        """Release resources; further calls are errors."""
        ...


@runtime_checkable
class ChangeFeed(Protocol):
    """What a shared backend tells about the other instances' writes, so that an
    instance's key filters stay complete (:mod:`stream_dedup.index.redis_log`)."""

    @property
    def following(self) -> bool:
        """Whether :meth:`follow_changes` was called and its position still holds."""
        ...

    def follow_changes(self) -> None:
        """Start following from the writes committed now: call it just before building
        the key filters from a scan, so that a write during the scan is heard of too."""
        ...

    def changes(self) -> list[tuple[int, Any]] | None:
        """Inside :meth:`Backend.exclusive`: every other instance's write since the last
        call, as (epoch, fingerprints of its look-up keys), oldest first; ``None`` when
        they cannot all be told (following stops: build the filters again)."""
        ...
