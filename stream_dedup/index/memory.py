"""An in-memory backend: for tests, tuning runs and offline runs without ``--index``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from stream_dedup.core.hashing import U64
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.keys import SCOPED


class MemoryBackend:
    """Dicts with the :class:`~stream_dedup.index.backend.Backend` contract: one for the
    index's own keys and epoch 0, one per later epoch (dropped whole, as RocksDB drops an
    epoch's column families)."""

    #: One process uses it: see :attr:`~stream_dedup.index.backend.Backend.shared`.
    shared: ClassVar[bool] = False

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._epochs: dict[int, dict[bytes, bytes]] = {0: self._data}
        self._bytes = 0
        self._writes = 0

    @property
    def location(self) -> str:
        return ":memory:"

    def _store(self, epoch: int, *, create: bool = False) -> dict[bytes, bytes]:
        store = self._epochs.get(epoch)
        if store is None:
            if not create:
                return {}
            store = self._epochs[epoch] = {}
        return store

    def get_many(self, keys: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        if epoch and any(key[0] not in SCOPED for key in keys):
            raise ValueError("only keys that belong to an epoch are read from one")
        get = self._store(epoch).get
        return [get(k) for k in keys]

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        epoch: int = 0,
        changed: U64 | None = None,
    ) -> tuple[int, dict[bytes, bytes]]:
        prepared = dict(puts)
        prepared.update(zip(ordered.keys, ordered.values, strict=True))
        return epoch, prepared

    def apply(
        self, prepared: tuple[int, dict[bytes, bytes]], committed: Callable[[], None] | None = None
    ) -> None:
        epoch, puts = prepared
        self._put(puts, epoch)
        if committed is not None:
            committed()

    def sidecar(self, name: str) -> Path | None:
        return None

    def claim(self, name: bytes, ttl_ms: int) -> bool:
        return True  # one process writes it

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sequence(self) -> int:
        return self._writes

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        self._put(puts, 0)

    def _put(self, puts: Mapping[bytes, bytes], epoch: int) -> None:
        scoped = self._store(epoch, create=True)
        for key, value in puts.items():
            store = scoped if key[0] in SCOPED else self._data
            old = store.get(key)
            # A new key adds key + value; an overwrite only swaps the value's bytes.
            self._bytes += len(value) - len(old) if old is not None else len(key) + len(value)
            store[key] = value
        self._writes += 1

    def epochs(self) -> list[int]:
        return sorted(self._epochs)

    def drop_epoch(self, epoch: int) -> None:
        if epoch == 0:
            gone = [k for k in self._data if k[0] in SCOPED]
            for key in gone:
                self._bytes -= len(key) + len(self._data.pop(key))
            return
        store = self._epochs.pop(epoch, {})
        self._bytes -= sum(len(k) + len(v) for k, v in store.items())

    def scan_prefix(self, prefix: bytes, epoch: int = 0) -> Iterator[tuple[bytes, bytes]]:
        if epoch not in self._epochs:
            raise KeyError(f"no epoch {epoch}")
        store = self._epochs[epoch]
        for key in sorted(k for k in store if k.startswith(prefix)):
            yield key, store[key]

    def scan_keys(self, prefix: bytes, epoch: int = 0) -> Iterator[bytes]:
        for key, _ in self.scan_prefix(prefix, epoch):
            yield key

    def size_bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        self._data.clear()
        self._epochs = {0: self._data}
        self._bytes = 0
