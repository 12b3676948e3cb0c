"""The column families of each epoch in one RocksDB database: opened, created, dropped.

Epoch 0 is the default layout: the default family and ``docs``
(:mod:`stream_dedup.index.rocks_families`), or the default family alone in a read-only
view of an index of the older layout. Epoch ``n`` has two families of its own, opened at
start when they exist (RocksDB requires every family to be opened) and created when the
epoch's first batch is prepared. An expired epoch's families are dropped whole; epoch 0's
records are deleted by key ranges instead, since its families also hold the index's own
keys.
"""

from __future__ import annotations

from typing import Any

from rocksdict import Rdict

from stream_dedup.errors import IndexStoreError
from stream_dedup.index.keys import DOC, SCOPED
from stream_dedup.index.rocks_families import (
    DOC_END,
    DOCS_FAMILY,
    docs_options,
    epoch_docs_family,
    epoch_family,
    epoch_number,
    small_options,
)

#: An epoch's records family, documents family, and their handles (``None``: the default
#: family) for a write batch.
Families = tuple[Rdict, Rdict, Any, Any]

#: Key ranges of the records that belong to an epoch, in the default family (epoch 0).
_SCOPED_RANGES = [(bytes([k]), bytes([k + 1])) for k in sorted(SCOPED) if bytes([k]) != DOC]


class EpochFamilies:
    """The families of every epoch of the database ``db`` at ``path``, by epoch number."""

    def __init__(self, db: Rdict, path: str, read_only: bool, opened: list[str]) -> None:
        """Hold the families ``opened`` with ``db``: epoch 0's and each other epoch's."""
        self._db = db
        self._path = path
        self._read_only = read_only
        # An old-layout index opened read-only keeps its documents in the default family.
        has_docs = DOCS_FAMILY in opened
        self._docs = db.get_column_family(DOCS_FAMILY) if has_docs else db
        #: The handle of epoch 0's documents family (``None`` once closed).
        self.docs_handle = db.get_column_family_handle(DOCS_FAMILY) if has_docs else None
        self._by_epoch: dict[int, Families] = {0: (db, self._docs, None, self.docs_handle)}
        listed = set(opened)
        for name in opened:
            number = epoch_number(name)
            if number is None or number in self._by_epoch:
                continue
            if read_only and not {epoch_family(number), epoch_docs_family(number)} <= listed:
                # The writer creates an epoch's two families one after the other, and drops
                # them so: a view opened in between sees one of them. Neither holds anything
                # committed (the commit naming a new epoch comes after both exist; a dropped
                # one had expired), so the view skips that epoch rather than fail.
                continue
            self._open(number)

    def _open(self, epoch: int) -> Families:
        """The families of ``epoch``, created if they do not exist yet."""
        names = epoch_family(epoch), epoch_docs_family(epoch)
        handles: list[Any] = []
        for name, options in zip(names, (small_options(), docs_options()), strict=True):
            family: Rdict | None
            try:
                family = self._db.get_column_family(name)
            except Exception:  # absent: created empty (unlisted until a commit names it)
                family = None if self._read_only else self._db.create_column_family(name, options)
            handles.append(family)
        small, docs = handles
        if small is None or docs is None:  # a read-only view of an epoch half created
            raise IndexStoreError(f"{self._path}: epoch {epoch} has no column families")
        entry = (
            small,
            docs,
            self._db.get_column_family_handle(names[0]),
            self._db.get_column_family_handle(names[1]),
        )
        self._by_epoch[epoch] = entry
        return entry

    def __getitem__(self, epoch: int) -> Families:
        """The families of ``epoch``, opened (or created) if they are not held yet."""
        entry = self._by_epoch.get(epoch)
        return entry if entry is not None else self._open(epoch)

    def held(self, epoch: int) -> Families:
        """The families of ``epoch``, which must be held (a :class:`KeyError` if not)."""
        entry = self._by_epoch.get(epoch)
        if entry is None:
            raise KeyError(f"{self._path} holds no epoch {epoch}")
        return entry

    def numbers(self) -> list[int]:
        """The epochs held (0 always), ascending."""
        return sorted(self._by_epoch)

    def drop(self, epoch: int) -> None:
        """Delete every record of ``epoch``: its families dropped whole, or, for epoch 0,
        range deletes of the kinds that belong to an epoch (compaction reclaims them)."""
        if epoch == 0:
            for lo, hi in _SCOPED_RANGES:
                self._db.delete_range(lo, hi)
            self._docs.delete_range(DOC, DOC_END)
            return
        entry = self._by_epoch.pop(epoch, None)
        if entry is None:
            return
        for family in entry[:2]:
            family.close()
        del entry
        self._db.drop_column_family(epoch_family(epoch))
        self._db.drop_column_family(epoch_docs_family(epoch))

    def flush_idle(self, current: int) -> None:
        """Start flushing the memtables of epochs no longer written (not waiting for it).

        An epoch's families stop receiving writes when the next epoch opens; what their
        memtables hold would otherwise keep every write-ahead log file since their last
        write from being recycled, up to :data:`~.rocks_families.MAX_WAL_BYTES` of log.
        """
        for epoch, (small, docs, _, _) in self._by_epoch.items():
            if epoch in (0, current):
                continue
            for family in (small, docs):
                if family.property_int_value("rocksdb.num-entries-active-mem-table"):
                    family.flush(wait=False)

    def families(self) -> list[Rdict]:
        """Every family held, each once (epoch 0's may be the default family alone)."""
        out: list[Rdict] = []
        for small, docs, _, _ in self._by_epoch.values():
            out.append(small)
            if docs is not small:
                out.append(docs)
        return out

    def close(self) -> None:
        """Close every family but the default one, and let go of their handles."""
        for epoch, (small, docs, _, _) in self._by_epoch.items():
            if docs is not small:
                docs.close()
            if epoch:
                small.close()
        # A column family handle keeps the database open, lock included, while it lives.
        self._by_epoch.clear()
        self.docs_handle = None
