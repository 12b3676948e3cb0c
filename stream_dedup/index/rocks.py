"""The RocksDB backend (rocksdict), the index's home in production.

Durability: every :meth:`RocksBackend.write` is one ``WriteBatch`` through the write-ahead
log, so a killed process (``kill -9``) loses nothing that ``write`` returned from; with
``sync=True`` the WAL is also fsynced, which additionally survives a machine crash at the
cost of one fsync per batch. RocksDB's LOCK file gives one writer per directory; a second
opener gets :class:`~stream_dedup.errors.IndexLockedError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from rocksdict import DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from stream_dedup.errors import IndexLockedError, IndexStoreError


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.lz4())
    opts.increase_parallelism(2)
    return opts


class RocksBackend:
    """A RocksDB database in one directory."""

    def __init__(self, path: str | Path, *, sync: bool = False) -> None:
        self._path = str(path)
        Path(self._path).mkdir(parents=True, exist_ok=True)
        try:
            self._db = Rdict(self._path, _options())
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's text
            text = str(exc)
            if "LOCK" in text or "lock" in text:
                raise IndexLockedError(self._path, text) from exc
            raise IndexStoreError(f"cannot open RocksDB index at {self._path}: {text}") from exc
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync

    @property
    def location(self) -> str:
        return self._path

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        values: list[bytes | None] = self._db.get(list(keys)) or []
        return values

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in puts.items():
            batch.put(key, value)
        self._db.write(batch, self._write_opts)

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key: bytes = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()

    def size_bytes(self) -> int:
        total = 0
        for name in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
            value = self._db.property_int_value(name)
            total += int(value or 0)
        wal = sum(p.stat().st_size for p in Path(self._path).glob("*.log"))
        return total + wal

    @property
    def db(self) -> Rdict:
        """The underlying rocksdict handle (for checkpoints)."""
        return self._db

    def flush(self) -> None:
        """Flush memtables to SST files (for snapshots and size reports)."""
        self._db.flush()

    def close(self) -> None:
        self._db.close()
