"""The RocksDB backend (rocksdict), the index's home in production.

Durability: every :meth:`RocksBackend.write` is one ``WriteBatch`` through the write-ahead
log, so a killed process (``kill -9``) loses nothing that ``write`` returned from; with
``sync=True`` the WAL is also fsynced, which additionally survives a machine crash at the
cost of one fsync per batch. RocksDB's LOCK file gives one writer per directory; a second
opener gets :class:`~stream_dedup.errors.IndexLockedError`.

Errors: rocksdict raises a plain ``Exception`` carrying RocksDB's status text for every
failed read or write. Each is raised on as :class:`~stream_dedup.errors.IndexIOError`
(:class:`~stream_dedup.errors.IndexCorruptError` for RocksDB's "Corruption" status), so a
caller tells a broken index from a bug by type: the service stops on the former instead of
blaming, and dead-lettering, the documents of the batch it was deciding.

Layout: document records (``d`` keys, ~85% of an index's bytes) live in a column family of
their own, ``docs``; every other key is in the default one. Docnums grow with arrival, so
each flush of ``docs`` holds a key range of its own and compaction moves those files down
the levels without rewriting them. Sharing a key space with the random band-bucket keys,
every compaction rewrote them, so most of RocksDB's background work went to copying
records that never change. The split is invisible above this class: keys are routed by
their first byte, and a prefix scan of ``b""`` merges both families in key order. A write
batch spans both families and stays atomic. An index of the older layout (documents in the
default family) is moved over when it is opened for writing, a chunk per atomic write, so
an interrupted move resumes at the next open; a read-only view reads whichever layout it
finds.
"""

from __future__ import annotations

import heapq
import logging
import os
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice, repeat
from operator import itemgetter
from pathlib import Path

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    DbClosedError,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from stream_dedup.errors import (
    IndexCorruptError,
    IndexIOError,
    IndexLockedError,
    IndexStoreError,
)
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.keys import DOC

log = logging.getLogger("stream_dedup.index")

_READ_CHUNK = 512
#: The column family of document records (see the module docstring).
DOCS_FAMILY = "docs"
#: Document records moved per atomic write when an index of the old layout is opened.
_MOVE_CHUNK = 2000
#: Records between two progress lines of such a move.
_MOVE_REPORT = 200_000
#: The first key after every document key.
_DOC_END = bytes([DOC[0] + 1])
#: The key of a (key, value) pair, to merge the two families' scans in key order.
_KEY = itemgetter(0)
#: Sorted runs of the default family before universal compaction merges some (see _options).
_SORTED_RUNS = 12
#: Write-ahead log files kept for reuse (see _options).
_RECYCLED_LOGS = 4


def _options() -> Options:
    """Options of the default family: band buckets, verdicts, exact texts, counters, offsets.

    Most band buckets a document looks up do not exist, so whole-key bloom filters, in the
    memtable and in every SST file, answer those misses without searching the memtable's
    skiplist or reading data blocks. The 4 MiB memtable holds about two batches of these
    small keys: a batch's ~36,000 random bucket keys are inserted into a skiplist that
    stays small. At 16 MiB it held eight batches and applying a batch cost markedly more
    CPU; at 2 MiB it flushed so often that compaction cost more than it saved.

    Compaction is *universal* (tiered), started at 12 sorted runs. A document writes ~19
    small keys here, spread at random over the key space, so under leveled compaction
    every compaction out of level 0 would overlap, and rewrite, the whole level below it;
    while this family is under ``max_bytes_for_level_base`` (256 MiB, about 450,000 news
    articles) that level is all of it, so each compaction would cost more as the index
    grew. Universal compaction merges runs of similar size, so a key is rewritten about
    log(n) times instead, and the cost per document stays flat as the index grows
    (``bench/bench_growth.py``; docs/benchmarks.md). A read checks one bloom filter per
    run, and reads here are few: the key filter of :mod:`stream_dedup.index.filter`
    answers most misses. Nothing is compressed: LZ4 shrinks these keys (random hashes and
    docnums) by only ~2%, for CPU at every flush and compaction.

    Write-ahead log files are recycled (:data:`_RECYCLED_LOGS`): a batch writes ~8 MB to
    the log, mostly document records, and a recycled file's pages are already allocated,
    so the write does not allocate them again, nor does an fsync (``index.sync``) update
    the file's size in its inode each time, which makes applying a batch cheaper. Recovery
    after a crash is unaffected: RocksDB's point-in-time recovery tells a recycled file's
    new records from its old.
    """
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.none())
    opts.set_compaction_style(DBCompactionStyle.universal())
    opts.set_level_zero_file_num_compaction_trigger(_SORTED_RUNS)
    opts.increase_parallelism(2)
    opts.set_recycle_log_file_num(_RECYCLED_LOGS)
    opts.set_write_buffer_size(4 << 20)
    opts.set_memtable_whole_key_filtering(True)
    opts.set_memtable_prefix_bloom_ratio(0.05)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def _docs_options() -> Options:
    """Options of the ``docs`` family: sequential keys, incompressible values.

    A document record is read only after a band bucket named its docnum, so it is always
    present and needs no bloom filter; its verification set is random 32-bit values, which
    no compression shrinks. 16 MiB is about two batches of 2,000 news articles: flushes
    start during a run rather than all at ``close``.
    """
    opts = Options(raw_mode=True)
    opts.set_compression_type(DBCompressionType.none())
    opts.set_write_buffer_size(16 << 20)
    return opts


def _upper_bound(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with ``prefix`` (``None``: no bound)."""
    while prefix and prefix[-1] == 0xFF:
        prefix = prefix[:-1]
    return prefix[:-1] + bytes([prefix[-1] + 1]) if prefix else None


def _from_rocksdb(exc: Exception) -> bool:
    """Whether rocksdict raised ``exc`` for a failed database operation.

    Those are plain ``Exception`` (RocksDB's status text) or ``DbClosedError``; a
    ``TypeError`` and the like is a bug in the caller and stays what it is.
    """
    return type(exc) is Exception or isinstance(exc, DbClosedError)


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

    def __init__(self, path: str | Path, *, sync: bool = False, read_only: bool = False) -> None:
        """Open (or create) the database at ``path``.

        ``read_only`` opens a frozen view that takes no lock: the state as of opening,
        readable while another process writes (see :mod:`stream_dedup.index.snapshot`).
        """
        self._path = str(path)
        self._read_only = read_only
        if not read_only:
            Path(self._path).mkdir(parents=True, exist_ok=True)
        opts = _options()
        opts.create_missing_column_families(True)
        families = {DOCS_FAMILY: _docs_options()}
        try:
            if read_only:
                present = Rdict.list_cf(self._path, Options(raw_mode=True))
                families = {f: o for f, o in families.items() if f in present}
                self._db = Rdict(
                    self._path, opts, column_families=families, access_type=AccessType.read_only()
                )
            else:
                self._db = Rdict(self._path, opts, column_families=families)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's text
            text = str(exc)
            if "LOCK" in text or "lock" in text:
                raise IndexLockedError(self._path, text) from exc
            if "comparator" in text:
                raise IndexStoreError(
                    f"{self._path} is not a stream-dedup index (a RocksDB database written by "
                    f"another program: {text}); point --index at a stream-dedup index directory"
                ) from exc
            raise IndexStoreError(f"cannot open RocksDB index at {self._path}: {text}") from exc
        # An old-layout index opened read-only keeps its documents in the default family.
        self._docs = self._db.get_column_family(DOCS_FAMILY) if families else self._db
        self._docs_handle = self._db.get_column_family_handle(DOCS_FAMILY) if families else None
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        if not read_only:
            try:
                self._move_documents()
            except Exception as exc:
                if not _from_rocksdb(exc):
                    raise
                raise self._failed("moving document records", exc) from exc

    def _failed(self, operation: str, exc: Exception) -> IndexStoreError:
        """The package's error for rocksdict's ``exc`` raised while doing ``operation``."""
        text = str(exc)
        if text.startswith("Corruption"):
            return IndexCorruptError(
                f"index at {self._path}: {operation} found corrupt data ({text}). Restore "
                "the index from a snapshot (`stream-dedup restore`) or rebuild it in an "
                "empty directory."
            )
        return IndexIOError(self._path, operation, text)

    def _move_documents(self) -> None:
        """Move document records of the old layout into the ``docs`` family.

        Each chunk is one atomic write (put there, delete here), so a move cut short leaves
        every record in exactly one family and the next open carries on. One iterator reads
        them all: it sees the records as they were when it started, and a new seek per chunk
        would step over every record deleted so far. A large index takes a while, so
        progress is logged every :data:`_MOVE_REPORT` records.
        """
        moved = 0
        scan = self._scan(self._db, DOC)
        while chunk := list(islice(scan, _MOVE_CHUNK)):
            batch = WriteBatch(raw_mode=True)
            for key, value in chunk:
                batch.put(key, value, self._docs_handle)
                batch.delete(key)
            self._db.write(batch, self._write_opts)
            moved += len(chunk)
            if moved % _MOVE_REPORT < _MOVE_CHUNK:
                log.info(
                    "moving document records to their own column family",
                    extra={"fields": {"index": self._path, "records": moved}},
                )
        if moved:
            self._db.compact_range(DOC, _DOC_END)  # drop the deleted records' tombstones
            log.info(
                "document records moved to their own column family",
                extra={"fields": {"index": self._path, "records": moved}},
            )

    @property
    def location(self) -> str:
        return self._path

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        try:
            return self._get_many_routed(keys)
        except Exception as exc:
            if not _from_rocksdb(exc):
                raise
            raise self._failed(f"reading {len(keys)} key(s)", exc) from exc

    def _get_many_routed(self, keys: Sequence[bytes]) -> list[bytes | None]:
        docs = [i for i, key in enumerate(keys) if key[:1] == DOC]
        if not docs:
            return self._get_many(self._db, keys)
        if len(docs) == len(keys):
            return self._get_many(self._docs, keys)
        values = self._get_many(self._db, keys)  # documents: absent here, filled in below
        for i, value in zip(docs, self._get_many(self._docs, [keys[i] for i in docs]), strict=True):
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
        self, puts: Mapping[bytes, bytes], ordered: OrderedPuts = NO_ORDERED_PUTS
    ) -> WriteBatch:
        # In key order: the memtable's skiplist then continues each insert from the last
        # one, which makes a batch of ~20k keys several times cheaper to apply.
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        keys = sorted(puts)  # keys alone: sorting (key, value) pairs is several times dearer
        # Document keys are one run of the sorted keys; they go to their own family.
        lo, hi = bisect_left(keys, DOC), bisect_left(keys, _DOC_END)
        docs, others = keys[lo:hi], keys[:lo] + keys[hi:]
        value = puts.__getitem__
        # map() drives the ~40,000 puts from C: a Python for loop costs as much again.
        deque(map(put, others, map(value, others)), maxlen=0)
        deque(map(put, docs, map(value, docs), repeat(self._docs_handle)), maxlen=0)
        ordered_keys = ordered.keys
        at = bisect_left(ordered_keys, DOC)  # they are in key order: one probe finds any
        if at < len(ordered_keys) and ordered_keys[at] < _DOC_END:
            raise ValueError("ordered puts may not hold document records")
        deque(map(put, ordered_keys, ordered.values), maxlen=0)
        return batch

    def apply(self, prepared: WriteBatch) -> None:
        try:
            self._db.write(prepared, self._write_opts)
        except Exception as exc:
            if not _from_rocksdb(exc):
                raise
            raise self._failed("writing a batch", exc) from exc

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        if prefix[:1] == DOC:
            return self._scan(self._docs, prefix)
        if not prefix and self._docs is not self._db:
            return heapq.merge(self._scan(self._db, b""), self._scan(self._docs, b""), key=_KEY)
        return self._scan(self._db, prefix)

    def _scan(self, family: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        try:
            it = family.iter()
            it.seek(prefix)
            while it.valid():
                key: bytes = it.key()
                if not key.startswith(prefix):
                    break
                yield key, it.value()
                it.next()
            it.status()  # valid() is False at the end, and also after a failed read
        except Exception as exc:
            if not _from_rocksdb(exc):
                raise
            raise self._failed(f"scanning records under prefix {prefix!r}", exc) from exc

    def scan_keys(self, prefix: bytes) -> Iterator[bytes]:
        if prefix[:1] == DOC:
            return self._scan_keys(self._docs, prefix)
        if not prefix and self._docs is not self._db:
            return heapq.merge(self._scan_keys(self._db, b""), self._scan_keys(self._docs, b""))
        return self._scan_keys(self._db, prefix)

    def _scan_keys(self, family: Rdict, prefix: bytes) -> Iterator[bytes]:
        # Keys only, iterated on rocksdict's side up to the prefix's end: several times
        # faster than stepping an iterator from Python, which costs a call per key.
        opts = ReadOptions()
        bound = _upper_bound(prefix)
        if bound is not None:
            opts.set_iterate_upper_bound(bound)
        key: bytes
        last: bytes | None = None
        try:
            for key in family.keys(from_key=prefix, read_opt=opts):  # type: ignore[assignment]
                if not key.startswith(prefix):
                    return
                last = key
                yield key
            # rocksdict's key iterator ends at a failed read as it ends at the last key,
            # which would truncate the scan (a key filter missing keys) without a word.
            # One seek past the last key seen tells the two apart.
            it = family.iter(opts)
            it.seek(prefix if last is None else last + b"\0")  # the first key not seen
            it.status()
            missed: bytes | None = it.key() if it.valid() else None
        except Exception as exc:
            if not _from_rocksdb(exc):
                raise
            raise self._failed(f"scanning keys under prefix {prefix!r}", exc) from exc
        if missed is not None and missed.startswith(prefix):
            raise IndexIOError(
                self._path,
                f"scanning keys under prefix {prefix!r}",
                f"the key iterator ended before {missed!r}, a key it should have returned",
            )

    def size_bytes(self) -> int:
        total = 0
        for family in self._families():
            for name in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
                total += int(family.property_int_value(name) or 0)
        return total + _wal_bytes(self._path)

    def sidecar(self, name: str) -> Path | None:
        return None if self._read_only else Path(self._path) / name

    def sequence(self) -> int:
        return int(self._db.latest_sequence_number())

    def _families(self) -> tuple[Rdict, ...]:
        return (self._db,) if self._docs is self._db else (self._db, self._docs)

    @property
    def db(self) -> Rdict:
        """The underlying rocksdict handle (for checkpoints)."""
        return self._db

    def flush(self) -> None:
        """Flush memtables to SST files (for snapshots and size reports)."""
        try:
            for family in self._families():
                family.flush()
        except Exception as exc:
            if not _from_rocksdb(exc):
                raise
            raise self._failed("flushing memtables", exc) from exc

    def close(self) -> None:
        if self._docs is not self._db:
            self._docs.close()
        # A column family handle keeps the database open, lock included, while it lives.
        self._docs_handle = None
        self._db.close()
