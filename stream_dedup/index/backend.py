"""The key-value contract both index backends implement.

Deliberately narrow (batched reads, one atomic write, prefix scan) so that the RocksDB and
in-memory implementations are interchangeable and tested by one suite, and so that all
layout and decision logic lives above it, once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol


class Backend(Protocol):
    """An ordered byte-key store with atomic batch writes."""

    @property
    def location(self) -> str:
        """Where the data lives (a path, or ``":memory:"``), for messages."""
        ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values for ``keys`` in order, ``None`` where absent (one batched read)."""
        ...

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        """Apply all ``puts`` atomically: after a crash either all are visible or none."""
        ...

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``, in key order."""
        ...

    def size_bytes(self) -> int:
        """Approximate bytes used (on disk for RocksDB, in memory for the dict)."""
        ...

    def close(self) -> None:
        """Release resources; further calls are errors."""
        ...
