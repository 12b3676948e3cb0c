"""The RocksDB backend (rocksdict), the index's home in production.

Durability: every :meth:`RocksBackend.write` is one ``WriteBatch`` through the write-ahead
log, so a killed process (``kill -9``) loses nothing that ``write`` returned from; with
``sync=True`` the WAL is also fsynced, which additionally survives a machine crash at the
cost of one fsync per batch. RocksDB's LOCK file gives one writer per directory; a second
opener gets :class:`~stream_dedup.errors.IndexLockedError`.

Errors: rocksdict raises a plain ``Exception`` carrying RocksDB's status text for every
failed read or write. Each is raised on as :class:`~stream_dedup.errors.IndexIOError`
(:class:`~stream_dedup.errors.IndexCorruptError` for RocksDB's "Corruption" status; see
:mod:`.rocks_errors`), so a caller tells a broken index from a bug by type: the service
stops on the former instead of blaming, and dead-lettering, the documents of the batch it
was deciding.

Layout: the column families, and why records are split among them, are described in
:mod:`stream_dedup.index.rocks_families`, each epoch's in :mod:`.rocks_epochs`. Keys are
routed to a family by their first byte and epoch, so the split is invisible above this
class; a write batch spans families and stays atomic, and a scan of every record merges
the families (:mod:`.rocks_scans`). An index of the older layout (documents in the default
family) is moved over when it is opened for writing (:mod:`.rocks_move`); a read-only view
reads whichever layout it finds.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from pathlib import Path
from typing import ClassVar, NamedTuple

from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from stream_dedup.core.hashing import U64
from stream_dedup.errors import IndexStoreError
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.keys import DOC, SCOPED
from stream_dedup.index.rocks_epochs import EpochFamilies
from stream_dedup.index.rocks_errors import failed, from_rocksdb, open_failed
from stream_dedup.index.rocks_families import (
    DOC_END,
    DOCS_FAMILY,
    docs_options,
    epoch_number,
    small_options,
)
from stream_dedup.index.rocks_move import move_documents
from stream_dedup.index.rocks_scans import epoch_items, epoch_keys
from stream_dedup.index.rocks_view import linked_view, remove_view

_READ_CHUNK = 512
#: Tries to open a secondary instance (see ``RocksBackend._open``).
_SECONDARY_OPENS = 5


class PreparedBatch(NamedTuple):
    """A prepared write: the batch, and the epoch its records go to."""

    batch: WriteBatch
    epoch: int


def _wal_bytes(path: str) -> int:
    """Bytes in write-ahead log files; RocksDB may delete one between listing and stat."""
    total = 0
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name.endswith(".log"):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    continue
    return total


class RocksBackend:
    """A RocksDB database in one directory."""

    #: One process writes it (RocksDB's lock): see ``Backend.shared``.
    shared: ClassVar[bool] = False

    def __init__(
        self,
        path: str | Path,
        *,
        sync: bool = False,
        read_only: bool = False,
        secondary: bool = False,
    ) -> None:
        """Open (or create) the database at ``path``.

        ``read_only`` opens a frozen view that takes no lock and writes nothing into the
        directory: the state as of opening, readable while another process writes (see
        :mod:`stream_dedup.index.snapshot`) or from a directory this process cannot write.
        ``secondary`` opens a RocksDB *secondary instance*: read-only too, and brought up
        to the writer's latest write by :meth:`catch_up` (the service's check process,
        :mod:`stream_dedup.index.follower`).
        """
        self._path = str(path)
        self._read_only = read_only or secondary
        self._secondary = secondary
        #: Where a read-only database is opened: a linked view (:mod:`.rocks_view`); a
        #: secondary instance's own directory (its info log).
        self._view: str | None = None
        if not self._read_only:
            Path(self._path).mkdir(parents=True, exist_ok=True)
        self._open()
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        self._writing: int | None = None  # the epoch the last write went to
        if not self._read_only:
            move_documents(self._db, self._epochs.docs_handle, self._write_opts, self._path)

    def _open(self) -> None:
        # A secondary lists the writer's families, then opens them: retention can drop
        # one in between ("Column family not found"), so it lists and opens again.
        tries = _SECONDARY_OPENS if self._secondary else 1
        for attempt in range(tries):
            try:
                families = self._open_database()
                break
            except Exception as exc:  # rocksdict raises plain Exception with RocksDB's text
                if self._view is not None:
                    remove_view(self._view)
                    self._view = None
                if attempt + 1 == tries:
                    raise open_failed(self._path, exc) from exc
        #: Each epoch's families (see :mod:`.rocks_epochs`).
        self._epochs = EpochFamilies(self._db, self._path, self._read_only, families)

    def _open_database(self) -> list[str]:
        """Open the database with every column family it has (RocksDB requires them all)
        and, for a writer, the ``docs`` family; the names of the families opened."""
        opts = small_options()
        opts.create_missing_column_families(True)
        families = {DOCS_FAMILY: docs_options()}
        present = (
            Rdict.list_cf(self._path, Options(raw_mode=True))
            if (Path(self._path) / "CURRENT").exists()
            else []
        )
        for name in present:
            number = epoch_number(name)
            if number is not None:
                families[name] = docs_options() if name.endswith("-docs") else small_options()
        if self._secondary:
            families = {f: o for f, o in families.items() if f in present}
            self._view = tempfile.mkdtemp(prefix="stream-dedup-secondary-")
            self._db = Rdict(
                self._path,
                opts,
                column_families=families,
                access_type=AccessType.secondary(self._view),
            )
        elif self._read_only:
            families = {f: o for f, o in families.items() if f in present}
            self._view = linked_view(self._path)
            self._db = Rdict(
                self._view,
                opts,
                column_families=families,
                access_type=AccessType.read_only(),
            )
        else:
            self._db = Rdict(self._path, opts, column_families=families)
        return list(families)

    def catch_up(self) -> bool:
        """A secondary instance: replay the writer's writes since the last catch-up;
        false when it must be reopened instead (:meth:`reopen`): the writer's manifest
        names a column family created after it opened, which RocksDB cannot catch up."""
        if not self._secondary:
            raise RuntimeError("only a secondary instance catches up")
        try:
            self._db.try_catch_up_with_primary()
        except Exception as exc:
            if not from_rocksdb(exc):
                raise
            return False
        return True

    def reopen(self) -> None:
        """A secondary instance opened again, with every column family the database has
        now: RocksDB shows a secondary no family created after it opened (a new
        retention epoch), and lets go of a dropped one only at a reopen."""
        self.close()
        self._open()

    def epochs(self) -> list[int]:
        """The epochs whose records are stored (0 always), ascending."""
        return self._epochs.numbers()

    def drop_epoch(self, epoch: int) -> None:
        """Delete every record of ``epoch``: its families dropped whole, or, for epoch 0,
        range deletes of the kinds that belong to an epoch (compaction reclaims them)."""
        try:
            self._epochs.drop(epoch)
        except Exception as exc:
            if not from_rocksdb(exc):
                raise
            raise self._failed(f"dropping epoch {epoch}", exc) from exc

    def _failed(self, operation: str, exc: Exception) -> IndexStoreError:
        """The package's error for rocksdict's ``exc`` raised while doing ``operation``."""
        return failed(self._path, operation, exc)

    @property
    def location(self) -> str:
        return self._path

    def get_many(self, keys: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        try:
            return self._get_many_routed(keys, epoch)
        except Exception as exc:
            if not from_rocksdb(exc):
                raise
            raise self._failed(f"reading {len(keys)} key(s)", exc) from exc

    def _get_many_routed(self, keys: Sequence[bytes], epoch: int) -> list[bytes | None]:
        small, docs_family, _, _ = self._epochs[epoch]
        if epoch and any(key[0] not in SCOPED for key in keys):
            raise ValueError("only keys that belong to an epoch are read from one")
        docs = [i for i, key in enumerate(keys) if key[:1] == DOC]
        if not docs:
            return self._get_many(small, keys)
        if len(docs) == len(keys):
            return self._get_many(docs_family, keys)
        values = self._get_many(small, keys)  # documents: absent here, filled in below
        found = self._get_many(docs_family, [keys[i] for i in docs])
        for i, value in zip(docs, found, strict=True):
            values[i] = value
        return values

    @staticmethod
    def _get_many(family: Rdict, keys: Sequence[bytes]) -> list[bytes | None]:
        # Multi-gets of _READ_CHUNK keys: rocksdict's cost per key grows with the list's
        # length, so a batch's ~20k keys go in chunks of a few hundred.
        get = family.get
        values: list[bytes | None] = []
        for lo in range(0, len(keys), _READ_CHUNK):
            values.extend(get(list(keys[lo : lo + _READ_CHUNK])) or [])
        return values

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        self.apply(self.prepare(puts))

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        epoch: int = 0,
        changed: U64 | None = None,
    ) -> PreparedBatch:
        # In key order: the memtable's skiplist then continues each insert from the last
        # one, which makes a batch of ~20k keys several times cheaper to apply.
        _, _, small, docs_handle = self._epochs[epoch]
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        keys = sorted(puts)  # keys alone: sorting (key, value) pairs is several times dearer
        # Document keys are one run of the sorted keys; they go to their own family.
        lo, hi = bisect_left(keys, DOC), bisect_left(keys, DOC_END)
        docs, others = keys[lo:hi], keys[:lo] + keys[hi:]
        value = puts.__getitem__
        # map() drives the ~40,000 puts from C: a Python for loop costs as much again.
        if small is None:
            deque(map(put, others, map(value, others)), maxlen=0)
        else:  # the index's own keys stay in the default family
            own = [k for k in others if k[0] not in SCOPED]
            mine = [k for k in others if k[0] in SCOPED]
            deque(map(put, own, map(value, own)), maxlen=0)
            deque(map(put, mine, map(value, mine), repeat(small)), maxlen=0)
        deque(map(put, docs, map(value, docs), repeat(docs_handle)), maxlen=0)
        ordered_keys = ordered.keys
        at = bisect_left(ordered_keys, DOC)  # they are in key order: one probe finds any
        if at < len(ordered_keys) and ordered_keys[at] < DOC_END:
            raise ValueError("ordered puts may not hold document records")
        if small is None:
            deque(map(put, ordered_keys, ordered.values), maxlen=0)
        else:
            deque(map(put, ordered_keys, ordered.values, repeat(small)), maxlen=0)
        return PreparedBatch(batch, epoch)

    def apply(self, prepared: PreparedBatch, committed: Callable[[], None] | None = None) -> None:
        batch, epoch = prepared
        try:
            self._db.write(batch, self._write_opts)
            if epoch and epoch != self._writing:  # epoch 0's writes are the index's own keys
                self._writing = epoch
                self._epochs.flush_idle(epoch)
        except Exception as exc:
            if not from_rocksdb(exc):
                raise
            raise self._failed("writing a batch", exc) from exc
        if committed is not None:
            committed()

    def scan_prefix(self, prefix: bytes, epoch: int = 0) -> Iterator[tuple[bytes, bytes]]:
        small, docs, _, _ = self._epochs.held(epoch)
        return epoch_items(self._path, small, docs, prefix)

    def scan_keys(self, prefix: bytes, epoch: int = 0) -> Iterator[bytes]:
        small, docs, _, _ = self._epochs.held(epoch)
        return epoch_keys(self._path, small, docs, prefix)

    def size_bytes(self) -> int:
        total = 0
        for family in self._epochs.families():
            for name in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
                total += int(family.property_int_value(name) or 0)
        return total + _wal_bytes(self._path)

    def sidecar(self, name: str) -> Path | None:
        return None if self._read_only else Path(self._path) / name

    def claim(self, name: bytes, ttl_ms: int) -> bool:
        return True  # the database's lock: no other process writes it

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the database's lock already excludes others

    def sequence(self) -> int:
        return int(self._db.latest_sequence_number())

    @property
    def db(self) -> Rdict:
        """The underlying rocksdict handle (for checkpoints)."""
        return self._db

    def flush(self) -> None:
        """Flush memtables to SST files (for snapshots and size reports)."""
        try:
            for family in self._epochs.families():
                family.flush()
        except Exception as exc:
            if not from_rocksdb(exc):
                raise
            raise self._failed("flushing memtables", exc) from exc

    def close(self) -> None:
        self._epochs.close()
        self._db.close()
        if self._view is not None:
            remove_view(self._view)
