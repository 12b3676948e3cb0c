"""An in-memory backend: for tests, tuning runs and offline runs without ``--index``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts


class MemoryBackend:
    """A dict with the :class:`~stream_dedup.index.backend.Backend` contract."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._bytes = 0
        self._writes = 0

    @property
    def location(self) -> str:
        return ":memory:"

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def prepare(
        self, puts: Mapping[bytes, bytes], ordered: OrderedPuts = NO_ORDERED_PUTS
    ) -> dict[bytes, bytes]:
        prepared = dict(puts)
        prepared.update(zip(ordered.keys, ordered.values, strict=True))
        return prepared

    def apply(self, prepared: dict[bytes, bytes]) -> None:
        self.write(prepared)

    def sidecar(self, name: str) -> Path | None:
        return None

    def sequence(self) -> int:
        return self._writes

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        for key, value in puts.items():
            old = self._data.get(key)
            # A new key adds key + value; an overwrite only swaps the value's bytes.
            self._bytes += len(value) - len(old) if old is not None else len(key) + len(value)
            self._data[key] = value
        self._writes += 1

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(k for k in self._data if k.startswith(prefix)):
            yield key, self._data[key]

    def scan_keys(self, prefix: bytes) -> Iterator[bytes]:
        for key, _ in self.scan_prefix(prefix):
            yield key

    def size_bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        self._data.clear()
        self._bytes = 0
