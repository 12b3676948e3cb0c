"""rocksdict's failures as the package's errors.

rocksdict raises a plain ``Exception`` carrying RocksDB's status text for every failed
read or write (``DbClosedError`` for a closed handle). Each is raised on as
:class:`~stream_dedup.errors.IndexIOError`, or :class:`~stream_dedup.errors.IndexCorruptError`
for RocksDB's "Corruption" status, so a caller tells a broken index from a bug by type.
"""

from __future__ import annotations

from rocksdict import DbClosedError

from stream_dedup.errors import (
    IndexCorruptError,
    IndexIOError,
    IndexLockedError,
    IndexStoreError,
)


def from_rocksdb(exc: Exception) -> bool:
    """Whether rocksdict raised ``exc`` for a failed database operation.

    Those are plain ``Exception`` (RocksDB's status text) or ``DbClosedError``; a
    ``TypeError`` and the like is a bug in the caller and stays what it is.
    """
    return type(exc) is Exception or isinstance(exc, DbClosedError)


def failed(path: str, operation: str, exc: Exception) -> IndexStoreError:
    """The package's error for rocksdict's ``exc`` raised while doing ``operation``."""
    text = str(exc)
    if text.startswith("Corruption"):
        return IndexCorruptError(
            f"index at {path}: {operation} found corrupt data ({text}). Restore "
            "the index from a snapshot (`stream-dedup restore`) or rebuild it in an "
            "empty directory."
        )
    return IndexIOError(path, operation, text)


def open_failed(path: str, exc: Exception) -> IndexStoreError:
    """The package's error for ``exc``, raised while opening the database at ``path``.

    Another process's lock and another program's database each get an error that says
    so; anything else is a plain failure to open.
    """
    text = str(exc)
    if "LOCK" in text or "lock" in text:
        return IndexLockedError(path, text)
    if "comparator" in text:
        return IndexStoreError(
            f"{path} is not a stream-dedup index (a RocksDB database written by "
            f"another program: {text}); point --index at a stream-dedup index directory"
        )
    return IndexStoreError(f"cannot open RocksDB index at {path}: {text}")
