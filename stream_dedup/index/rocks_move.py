"""The move of an older layout's document records into their own column family.

Indexes written before the ``docs`` family existed (:mod:`.rocks_families`) hold their
document records in the default family. A writer opening one moves them over, a chunk per
atomic write (put there, delete here), so a move cut short leaves every record in exactly
one family and the next open carries on. A read-only view reads whichever layout it finds
and moves nothing.
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import Any

from rocksdict import Rdict, WriteBatch, WriteOptions

from stream_dedup.index.keys import DOC
from stream_dedup.index.rocks_errors import failed, from_rocksdb
from stream_dedup.index.rocks_families import DOC_END
from stream_dedup.index.rocks_scans import family_items

log = logging.getLogger("stream_dedup.index")

#: Document records moved per atomic write.
_MOVE_CHUNK = 2000
#: Records between two progress lines of a move.
_MOVE_REPORT = 200_000


def move_documents(db: Rdict, docs_handle: Any, write_opts: WriteOptions, path: str) -> None:
    """Move the document records in ``db``'s default family to the family of ``docs_handle``.

    One iterator reads them all: it sees the records as they were when it started, and a
    new seek per chunk would step over every record deleted so far. A large index takes
    a while, so progress is logged every :data:`_MOVE_REPORT` records.
    """
    try:
        _move(db, docs_handle, write_opts, path)
    except Exception as exc:
        if not from_rocksdb(exc):
            raise
        raise failed(path, "moving document records", exc) from exc


def _move(db: Rdict, docs_handle: Any, write_opts: WriteOptions, path: str) -> None:
    moved = 0
    scan = family_items(path, db, DOC)
    while chunk := list(islice(scan, _MOVE_CHUNK)):
        batch = WriteBatch(raw_mode=True)
        for key, value in chunk:
            batch.put(key, value, docs_handle)
            batch.delete(key)
        db.write(batch, write_opts)
        moved += len(chunk)
        if moved % _MOVE_REPORT < _MOVE_CHUNK:
            log.info(
                "moving document records to their own column family",
                extra={"fields": {"index": path, "records": moved}},
            )
    if moved:
        db.compact_range(DOC, DOC_END)  # drop the deleted records' tombstones
        log.info(
            "document records moved to their own column family",
            extra={"fields": {"index": path, "records": moved}},
        )
