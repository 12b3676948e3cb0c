"""Consistent backups of an index, taken while the service runs or not.

Stopped index (no writer holds the lock): a RocksDB checkpoint, which hard-links the SST
files and is as fast as it is consistent. Running index (the service holds the lock): the
index is opened read-only, which replays the write-ahead log into a private, frozen view,
and every key is copied into a new database. Each service batch is one atomic
``WriteBatch``, and WAL replay applies whole batches only, so the copy is the state after
some batch: index records and stored input offsets agree, and a service restored from it
resumes from those offsets.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from rocksdict import Checkpoint

from stream_dedup.errors import IndexLockedError, IndexStoreError
from stream_dedup.index import keys
from stream_dedup.index.opener import holds_database, open_rocks

_COPY_BATCH = 5000


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What a snapshot holds: where, how it was taken, how many keys."""

    path: str
    method: str
    keys: int
    #: Where a restore with ``force`` moved the index it replaced; None if there was none.
    replaced: str | None = None


def _check_target(dest: Path) -> None:
    if dest.exists() and any(dest.iterdir()):
        raise IndexStoreError(f"{dest} exists and is not empty: choose a new backup directory")
    if dest.exists():
        dest.rmdir()


def _count_keys(path: Path) -> int:
    view = open_rocks(path, read_only=True)
    try:
        if view.get_many([keys.META])[0] is None:
            raise IndexStoreError(f"{path} holds no stream-dedup index metadata")
        return sum(1 for epoch in view.epochs() for _ in view.scan_keys(b"", epoch))
    finally:
        view.close()


def snapshot(
    index_dir: str | Path, dest: str | Path, progress: Callable[[int], None] | None = None
) -> SnapshotInfo:
    """Write a consistent copy of the index at ``index_dir`` to the new directory ``dest``."""
    src, target = Path(index_dir), Path(dest)
    if not holds_database(src):
        raise IndexStoreError(f"{src} holds no index")
    _check_target(target)
    try:
        backend = open_rocks(src)
    except IndexLockedError:
        return _copy_live(src, target, progress)
    try:
        backend.flush()
        Checkpoint(backend.db).create_checkpoint(str(target))
    finally:
        backend.close()
    return SnapshotInfo(str(target), "checkpoint", _count_keys(target))


def _copy_live(src: Path, target: Path, progress: Callable[[int], None] | None) -> SnapshotInfo:
    """Copy every key of a running index through a read-only view (see module docstring).

    The copy is written in the current layout, whichever layout the running index has,
    epoch by epoch (:mod:`stream_dedup.index.retention`).
    """
    view = open_rocks(src, read_only=True)
    copied = 0
    try:
        if view.get_many([keys.META])[0] is None:
            raise IndexStoreError(f"{src} holds no stream-dedup index metadata")
        out = open_rocks(target)
        try:
            for epoch in view.epochs():
                scan = view.scan_prefix(b"", epoch)
                while chunk := dict(islice(scan, _COPY_BATCH)):
                    out.apply(out.prepare(chunk, epoch=epoch))
                    copied += len(chunk)
                    if progress is not None:
                        progress(copied)
            out.flush()
        finally:
            out.close()
    finally:
        view.close()
    return SnapshotInfo(str(target), "live copy (read-only view)", copied)


def restore(backup: str | Path, index_dir: str | Path, *, force: bool = False) -> SnapshotInfo:
    """Put a snapshot back as the index at ``index_dir`` (the service must be stopped).

    An existing index there is refused unless ``force``; with ``force`` it is moved aside,
    never deleted, so a wrong restore can be undone: to ``<index_dir>.replaced``, or the
    first of ``<index_dir>.replaced.1``, ``.2``, ... that does not exist yet, so a second
    restore keeps the index the first one replaced (:func:`aside_name`). The result's
    ``replaced`` says where.
    """
    src, target = Path(backup), Path(index_dir)
    count = _count_keys(src)
    if target.exists() and any(target.iterdir()):
        open_rocks(target).close()  # raises IndexLockedError while a service runs on it
        if not force:
            raise IndexStoreError(
                f"{target} already holds data: stop the service and pass --force to replace it "
                f"(the old index is moved aside to {aside_name(target)}, not deleted)"
            )
        aside = aside_name(target)
        target.rename(aside)
        shutil.copytree(src, target)
        return SnapshotInfo(str(target), "restore", count, replaced=str(aside))
    if target.exists():
        target.rmdir()
    shutil.copytree(src, target)
    return SnapshotInfo(str(target), "restore", count)


def aside_name(index_dir: Path) -> Path:
    """Where a forced restore moves the index at ``index_dir``: a name not taken yet.

    ``<index_dir>.replaced``, else ``<index_dir>.replaced.1``, ``.2``, ...: an index kept
    aside by an earlier restore is never overwritten or deleted.
    """
    base = index_dir.with_name(index_dir.name + ".replaced")
    aside, n = base, 0
    while aside.exists() or aside.is_symlink():
        n += 1
        aside = base.with_name(f"{base.name}.{n}")
    return aside
