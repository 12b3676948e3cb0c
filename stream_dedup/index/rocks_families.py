"""The RocksDB column families of an index and the options each is opened with.

Document records (``d`` keys, ~65% of an index's bytes) live in a column family of their
own, ``docs``; the small records (band buckets, verdicts, exact texts, change points) and
the index's own keys (metadata, counters, offsets, intent, epoch table) in the default
one. Docnums grow with arrival, so each flush of ``docs`` holds a key range of its own and
compaction moves those files down the levels without rewriting them. Sharing a key space
with the random band-bucket keys, every compaction rewrote them, so most of RocksDB's
background work went to copying records that never change.

Epochs (:mod:`stream_dedup.index.retention`): the above is epoch 0, an index without
retention. Epoch ``n`` keeps its records in two families of its own, ``epoch-<n>`` and
``epoch-<n>-docs``, with the same options, created when its first batch is prepared and
dropped whole when it expires: RocksDB deletes their files at once, with no compaction.
Every family is listed and opened at start, as RocksDB requires.
"""

from __future__ import annotations

from rocksdict import BlockBasedOptions, DBCompactionStyle, DBCompressionType, Options

from stream_dedup.index.keys import DOC

#: The column family of document records (see the module docstring).
DOCS_FAMILY = "docs"
#: The first key after every document key: ``[DOC, DOC_END)`` is what that family holds.
DOC_END = bytes([DOC[0] + 1])
#: Sorted runs of the default family before universal compaction merges some (see small_options).
_SORTED_RUNS = 12
#: Write-ahead log bytes after which RocksDB flushes the families holding the oldest log
#: (about two batches of news). With retention the default family takes only the
#: index's own small keys, so its memtable fills slowly and, unflushed, would keep every
#: log file since its last flush from being recycled. The log is part of the index's bytes
#: on disk: at 64 MiB it was ~230 bytes per held document beside a 100,000-document window;
#: flushing the documents' memtable more often (~2 MB files, moved down the levels without
#: rewriting: their keys are sequential) costs little.
MAX_WAL_BYTES = 4 << 20
#: RocksDB's own info log (``LOG``: options, flush and compaction events) is rolled at
#: this size and two old files are kept: at its default (no limit, 1,000 old files) it
#: grew by ~20 bytes per document indexed, a share of the index's bytes on disk that
#: nothing reads.
_INFO_LOG_BYTES = 256 << 10


def epoch_family(epoch: int) -> str:
    """The column family of epoch ``epoch``'s records other than documents."""
    return f"epoch-{epoch}"


def epoch_docs_family(epoch: int) -> str:
    """The column family of epoch ``epoch``'s document records."""
    return f"epoch-{epoch}-docs"


def epoch_number(family: str) -> int | None:
    """The epoch a column family belongs to (``None``: not an epoch family)."""
    if not family.startswith("epoch-"):
        return None
    number = family[len("epoch-") :].removesuffix("-docs")
    return int(number) if number.isdigit() else None


def small_options() -> Options:
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
    answers most misses. The bottommost sorted run is compressed with zstd: once document
    records hold compressed text (format 4), these records are half of an index's bytes,
    and zstd takes ~25% off them (bucket members are docnums whose high bytes are zero,
    verdicts are JSON with repeated keys): 1,241 against 917 bytes per document on disk in
    all, LZ4 1,000 (``bench/bench_bytes.py``, docs/benchmarks.md). Flushes and the
    younger runs, written again soon, take LZ4: zstd at every flush and compaction cost
    RocksDB's background threads ~1.5x the CPU per document at 50,000-100,000 documents
    (``bench/bench_growth.py``), LZ4 there and zstd at the bottom about what format 2's
    uncompressed sets cost, no compression above the bottom a little more (more bytes to
    write) and ~1,030 bytes per document as left against ~960 with LZ4.

    No write-ahead log file is recycled: a secondary instance (the service's check
    process, :mod:`stream_dedup.index.follower`) tailing the log stalls on a recycled
    file's old records (opening one hung in tests), and a recycled file is kept at its
    full size, part of the index's bytes on disk. Recycling saved ~10% of applying a
    batch (~2 µs per document, docs/benchmarks.md).
    """
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.lz4())
    opts.set_bottommost_compression_type(DBCompressionType.zstd())
    opts.set_compaction_style(DBCompactionStyle.universal())
    opts.set_level_zero_file_num_compaction_trigger(_SORTED_RUNS)
    opts.increase_parallelism(2)
    opts.set_recycle_log_file_num(0)
    opts.set_max_total_wal_size(MAX_WAL_BYTES)
    opts.set_max_log_file_size(_INFO_LOG_BYTES)
    opts.set_keep_log_file_num(2)
    opts.set_write_buffer_size(4 << 20)
    opts.set_memtable_whole_key_filtering(True)
    opts.set_memtable_prefix_bloom_ratio(0.05)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def docs_options() -> Options:
    """Options of the ``docs`` family: sequential keys, incompressible values.

    A document record is read only after a band bucket named its docnum, so it is always
    present and needs no bloom filter; its payload is a zstd frame (format 4) or a set of
    random 32-bit values (formats 2 and 3), neither of which block compression shrinks. 16 MiB is
    about twelve batches of 2,000 news articles of format 4 (two of formats 2 and 3): flushes start
    during a run rather than all at ``close``.
    """
    opts = Options(raw_mode=True)
    opts.set_compression_type(DBCompressionType.none())
    opts.set_write_buffer_size(16 << 20)
    return opts
