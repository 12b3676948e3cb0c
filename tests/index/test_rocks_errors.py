"""RocksDB failures become the package's index errors, never a silently short answer.

Real failures of a real database on disk: a closed handle (every operation fails inside
RocksDB) and data blocks overwritten under an open database (checksum mismatches).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_dedup.errors import IndexCorruptError, IndexIOError, IndexStoreError
from stream_dedup.index import RocksBackend

KEYS = [b"b%05d" % i for i in range(5000)]
#: Each operation a caller may run, reading or writing every family.
OPERATIONS: dict[str, Callable[[RocksBackend], object]] = {
    "get_many": lambda b: b.get_many([KEYS[1], b"d" + KEYS[2]]),
    "write": lambda b: b.write({b"b-new": b"x"}),
    "apply": lambda b: b.apply(b.prepare({b"b-new": b"x"})),
    "scan_prefix": lambda b: list(b.scan_prefix(b"b")),
    "scan_prefix all": lambda b: list(b.scan_prefix(b"")),
    "scan_keys": lambda b: list(b.scan_keys(b"b")),
    "scan_keys all": lambda b: list(b.scan_keys(b"")),
    "flush": lambda b: b.flush(),
}


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[RocksBackend]:
    backend = RocksBackend(tmp_path / "index")
    backend.write({k: os.urandom(100) for k in KEYS})
    backend.write({b"d" + k: os.urandom(100) for k in KEYS[:100]})
    backend.flush()
    yield backend
    with contextlib.suppress(Exception):  # a test closed the database under it
        backend.close()


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_closed_database_raises_index_io_errors_naming_the_index(
    backend: RocksBackend, operation: str
) -> None:
    backend.db.close()
    with pytest.raises(IndexIOError, match="already closed") as caught:
        OPERATIONS[operation](backend)
    assert caught.value.path == backend.location
    assert backend.location in str(caught.value) and "check the disk" in str(caught.value)


@pytest.mark.parametrize("operation", ["get_many", "scan_prefix", "scan_keys", "scan_keys all"])
def test_corrupt_blocks_raise_instead_of_answering_short(
    backend: RocksBackend, operation: str
) -> None:
    """Overwritten data blocks: reads fail their checksum. A key scan must not end early as
    if the keys were not there (rocksdict's key iterator stops quietly at a failed read)."""
    for sst in Path(backend.location).glob("*.sst"):
        with sst.open("r+b") as f:
            f.seek(200)
            f.write(b"\xff" * 4000)
    with pytest.raises(IndexCorruptError, match="checksum mismatch"):
        OPERATIONS[operation](backend)


def test_a_callers_bug_is_not_an_index_error(backend: RocksBackend) -> None:
    """rocksdict's own type checks stay what they are: the index is fine."""
    with pytest.raises(KeyError) as caught:
        backend.get_many(["not bytes"])  # type: ignore[list-item]
    assert not isinstance(caught.value, IndexStoreError)
