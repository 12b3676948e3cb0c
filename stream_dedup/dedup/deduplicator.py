"""The deduplicator: a batch of documents decided against one index, then committed.

:meth:`Deduplicator.decide` goes in named steps: read what the index knows of the batch's
ids and texts (:func:`~.reads.read_known`), read what it holds that they may match
(:func:`~.reads.read_held`), run the compiled matching pass
(:func:`~stream_dedup.core.match.match_batch`), and turn its numbers into verdicts and
staged index writes (:func:`~.writes.verdicts_and_writes`). Nothing is written until
:meth:`Deduplicator.commit`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.containment import load_kernels
from stream_dedup.core.hashing import U32
from stream_dedup.core.match import I64, Expiry, Matches, match_batch
from stream_dedup.core.payload import payload_sets
from stream_dedup.core.set_cache import SetCache
from stream_dedup.core.sketch import Sketch, sketch
from stream_dedup.dedup.batch import BatchResult, BatchStats
from stream_dedup.dedup.dictionary import DictionaryTrainer
from stream_dedup.dedup.excerpts import Relations, find_excerpts
from stream_dedup.dedup.full_buckets import FullBuckets
from stream_dedup.dedup.kernels import COMPILING_NOTICE, kernels_cached
from stream_dedup.dedup.predecide import PredecideCounts, Predecided, predecide, settle
from stream_dedup.dedup.prune import needed_records
from stream_dedup.dedup.reads import Held, Known, clocks, payloads, read_held, read_known
from stream_dedup.dedup.writes import verdicts_and_writes
from stream_dedup.index.backend import OrderedPuts
from stream_dedup.index.bucket_records import bucket_puts
from stream_dedup.index.store import DedupIndex, PendingCommit
from stream_dedup.models import Document

#: Bytes of verification sets the deduplicator keeps: about 30,000 news articles' sets.
#: Sized by the hit rates measured on a growing index without a window (docs/benchmarks.md,
#: 2026-11-26): 32 MiB found 49% of candidates' sets at 0-100k documents and 26% at
#: 200-300k, 128 MiB 79% and 49%, for 40-120 MB more resident memory as it fills.
SET_CACHE_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class Decided:
    """A batch read and matched, its verdicts and write not built
    (:meth:`Deduplicator.decide_parts`); ``first``: the docnum its first indexed
    document was given (the ``indexed`` counter it was matched at)."""

    docs: Sequence[Document]
    sk: Sketch
    known: Known
    held: Held
    found: Matches
    queries: tuple[U32, I64, I64]
    stats: BatchStats
    relations: Relations | None
    epoch: int
    doc_clock: I64
    first: int


class Deduplicator:
    """Decides batches of documents against one :class:`DedupIndex`."""

    def __init__(self, index: DedupIndex, config: DedupConfig) -> None:
        self.index = index
        self.config = config
        self.plan = config.band_plan()
        self._exact = config.verify == "exact"
        self._bucket_bytes = 8 * config.max_bucket_size
        #: Verification sets of recent candidates and indexed documents, rebuilt from the
        #: texts the index stores (see :mod:`stream_dedup.core.payload`).
        self.set_cache = SetCache(SET_CACHE_BYTES, config)
        #: Sampled values whose buckets are full, not read again (containment on).
        self.full_buckets = (
            FullBuckets(index.params.containment_cap) if config.containment else None
        )
        #: The payload dictionary, loaded from the index or trained on its first texts.
        self.payload_dictionary = DictionaryTrainer(index, self._exact)
        self._warming = False
        #: Work the batches decided left for after the lease (:meth:`after_lease`).
        self._pending: list[Callable[[], None]] = []
        #: How the batches decided before a shared index's lease were settled in it.
        self.predecided = PredecideCounts()
        #: Documents sketched here to be decided, not handed in sketched (the service's
        #: ``stream_dedup_sketched_documents_total{by="service"}``).
        self.sketched_here = 0

    def warm_up(self, notice: Callable[[str], None] | None = None) -> None:
        """Load the compiled kernels now, so the first batch does not wait for them.

        The first call of a compiled kernel loads it from numba's on-disk cache (or
        compiles it, the first time on a machine): close to a second that would otherwise
        land on the latency of the first documents. Deciding a throw-away pair of texts
        (one near-duplicate of the other) runs every kernel the configuration uses; the
        index is read, which builds its key filter now, but not written. ``notice`` is
        given :data:`COMPILING_NOTICE` first when the kernels must be compiled (see
        :func:`kernels_cached`), so a long silent pause is explained.
        """
        self.index.warm_up()  # on the backend's own thread, meanwhile
        texts = ["warm-up text for the compiled kernels", "warm-up text for the kernels"]
        containment = self.config.containment > 0
        if notice is not None and not kernels_cached(containment):
            notice(COMPILING_NOTICE)
        docs = [Document(f"\x00warm-up {i}", t) for i, t in enumerate(texts)]
        self._warming = True  # the throw-away texts are no sample for a dictionary
        try:
            with jit.forced(True):  # two documents would otherwise run the Python forms
                sk = self.sketch(docs)
                self.decide(docs, sk)
                if sk.payloads:  # no candidate here is rebuilt from its text: load that kernel
                    payload_sets(sk.payloads, self.config)
                if containment:  # the pair above is a near-duplicate: it verified no excerpt
                    load_kernels()
        finally:
            self._warming = False

    def process(
        self, docs: Sequence[Document], offsets: Mapping[tuple[str, int], int] | None = None
    ) -> BatchResult:
        """``decide`` then ``commit``: the offline path."""
        result = self.decide(docs)
        self.commit(result, offsets)
        return result

    def commit(
        self, result: BatchResult, offsets: Mapping[tuple[str, int], int] | None = None
    ) -> None:
        """Persist a decided batch (and the input offsets it covers) in one atomic write,
        then run what it left for later batches (:meth:`after_lease`)."""
        self.index.apply(self.prepare(result, offsets))
        self.after_lease()

    def prepare(
        self, result: BatchResult, offsets: Mapping[tuple[str, int], int] | None = None
    ) -> PendingCommit:
        """The write :meth:`commit` makes, built for a later ``index.apply``."""
        return self.index.prepare(
            result.puts,
            result.counter_deltas,
            offsets,
            ordered=result.bucket_puts,
            ordered_fingerprints=result.bucket_fingerprints,
            epoch=result.epoch,
            points=result.points,
            clock=result.clock,
            records=result.records,
        )

    def sketch(self, docs: Sequence[Document]) -> Sketch:
        """The index-independent part of deciding ``docs`` (see :mod:`stream_dedup.core.sketch`)."""
        dictionary = self.payload_dictionary.dictionary
        return sketch([d.content for d in docs], self.config, self.plan, dictionary)

    def decide(self, docs: Sequence[Document], sketched: Sketch | None = None) -> BatchResult:
        """Verdicts for ``docs`` in order; see :mod:`stream_dedup.dedup` for the rules.

        ``sketched`` is ``docs``' sketch when it was computed elsewhere (the service's
        sketch worker computes it one batch ahead); by default it is computed here. The
        matching itself is one pass (:func:`~stream_dedup.core.match.match_batch`, compiled
        unless the batch is small); this method gathers its inputs from the index and
        turns its numbers into verdicts and records.
        """
        self.after_lease()  # what an earlier batch left, if nothing ran it
        parts = self.decide_parts(docs, sketched)
        self.leave_for_later(parts.sk, parts.found)
        return self.result_of(parts)

    def predecide(
        self, docs: Sequence[Document], sketched: Sketch | None = None
    ) -> Predecided | None:
        """``docs`` decided before a shared index's lease (:mod:`.predecide`); ``None``
        where they are decided inside it only."""
        return predecide(self, docs, sketched)

    def settle(self, pre: Predecided) -> BatchResult | None:
        """Inside the lease: ``pre``'s verdicts and write, or ``None`` when the batch must
        be decided again (:func:`~.predecide.settle`)."""
        return settle(self, pre)

    def decide_parts(
        self, docs: Sequence[Document], sketched: Sketch | None = None, *, ahead: bool = False
    ) -> Decided:
        """What :meth:`decide` reads and matches: everything that asks the index.

        ``ahead``: decided outside a shared index's lease (:mod:`.predecide`), where a
        newer write may be read in part: documents numbered past the counters read are
        left out (the batch's documents that meet them are decided again in the lease)."""
        if sketched is None:
            sketched = self.sketch(docs)
            self.sketched_here += len(docs)
        sk = sketched
        if sk.size != len(docs):
            raise ValueError("the sketch handed in is not the sketch of these documents")
        if not self.index.shared:  # sets of a batch never committed go (see trust_below)
            self.set_cache.trust_below(self.index.counter("indexed"))
        known = read_known(self.index, docs, sk, self.config.revisions)
        epoch = self.index.batch_epoch()
        below = self.index.counter("indexed") if ahead else None
        if below is not None:
            known.group_docnum[known.group_docnum >= below] = -1
        held = read_held(self.index, sk, known, epoch, below)
        doc_clock = clocks(docs, self.index.timeline.clock)
        queries = self._queries(sk)
        found = self._match(sk, known, held, epoch, doc_clock, queries)
        relations = None
        if self.config.containment:
            relations = find_excerpts(
                self.index, self.config, docs, sk, known.fresh, held, found, epoch, self.set_cache,
                self.full_buckets,
            )  # fmt: skip
        stats = BatchStats.of(found, sk.live, len(docs))
        stats.excerpts = 0 if relations is None else relations.excerpts
        stats.untimed = sum(d.time is None for d in docs)
        stats.window_without_time = (
            bool(docs) and stats.untimed == len(docs) and bool(self.index.retention.window)
        )
        first = self.index.counter("indexed")
        return Decided(
            docs, sk, known, held, found, queries, stats, relations, epoch, doc_clock, first
        )

    def result_of(self, parts: Decided) -> BatchResult:
        """The verdicts and the write of a batch read and matched (:meth:`decide_parts`),
        built from ``parts`` without changing them."""
        docs, sk, known, held, found = parts.docs, parts.sk, parts.known, parts.held, parts.found
        relations = parts.relations
        # A batch of repeated ids adds its own records to the candidates' as it goes.
        records = dict(held.records) if known.repeats else held.records
        stats = copy.copy(parts.stats)
        verdicts, staged = verdicts_and_writes(
            docs, sk, known, records, found, parts.queries, stats, relations
        )
        ordered, written = bucket_puts(
            sk.bucket_keys, sk.bucket_order, held.slot, found, self.plan.bands
        )
        fingerprints = sk.bucket_fingerprints[written]
        if relations is not None and relations.puts.keys:
            # Sampled keys are of the highest band: they sort after every band key.
            ordered = OrderedPuts(
                [*ordered.keys, *relations.puts.keys], [*ordered.values, *relations.puts.values]
            )
            fingerprints = np.concatenate([fingerprints, relations.fingerprints])
        clock = int(parts.doc_clock[-1]) if len(docs) else self.index.timeline.clock
        return BatchResult(
            verdicts,
            staged.puts,
            ordered,
            staged.counters,
            stats,
            fingerprints,
            parts.epoch,
            (found.points_doc, found.points_clock),
            clock,
        )

    def leave_for_later(self, sk: Sketch, found: Matches) -> None:
        """What the batch leaves for the batches after it, not for its own verdicts: its
        sets kept in the cache, its texts gathered for the payload dictionary. On a
        shared index that waits for :meth:`after_lease` (the next decide runs it first
        where nothing did), so the lease does not hold it."""
        warming = self._warming

        def later() -> None:
            self._remember(sk, found)
            if not warming:
                self.payload_dictionary.gather(sk)

        if self.index.shared:
            self._pending.append(later)
        else:
            later()

    def after_lease(self) -> None:
        """Run what the last decided batches left for later (see :meth:`leave_for_later`): the
        service calls it once a shared index's lease is let go, :meth:`commit` once the
        batch is stored."""
        pending, self._pending = self._pending, []
        for later in pending:
            later()

    def _remember(self, sk: Sketch, found: Matches) -> None:
        """Keep the sets of the documents this batch indexes: their re-runs, which tend
        to follow soon, find them without rebuilding them."""
        if not sk.payloads:
            return
        given = np.flatnonzero(found.docnum >= 0)
        self.set_cache.keep_spans(
            found.docnum[given],
            [sk.payloads[p] for p in given.tolist()],
            sk.set_flat,
            sk.set_at[given],
            sk.set_len[given],
        )

    def _queries(self, sk: Sketch) -> tuple[U32, I64, I64]:
        """What verification compares for each live document of the batch, as ``(flat,
        start, length)``: its verification set (``verify = "exact"``) or its signature."""
        if self._exact:
            return sk.set_flat, sk.set_at, sk.set_len
        per, n_live = self.config.num_perm, len(sk.live)
        q_flat = sk.sigs.reshape(-1)
        return (
            q_flat,
            np.arange(n_live, dtype=np.int64) * per,
            np.full(n_live, per, dtype=np.int64),
        )

    def _match(
        self,
        sk: Sketch,
        known: Known,
        held: Held,
        epoch: int,
        doc_clock: I64,
        queries: tuple[U32, I64, I64],
    ) -> Matches:
        """The compiled matching pass over what :meth:`decide` read, with retention's
        expiry measured on each document's clock (``doc_clock``)."""
        cfg, index = self.config, self.index
        needed = needed_records(held, sk.set_len, known.fresh, self.plan.bands, cfg)
        first_docnum = index.counter("indexed")
        timeline, retention, live = index.timeline, index.retention, sk.live
        expiry = Expiry(
            doc_clock[live] if live else np.empty(0, np.int64),
            timeline.points_doc,
            timeline.points_clock,
            retention.window,
            retention.max_documents,
            epoch != timeline.current.number,
        )
        return match_batch(
            fresh=known.fresh,
            text_group=known.text_group,
            group_docnum=known.group_docnum,
            slot=held.slot,
            committed=held.committed,
            bands=self.plan.bands,
            max_members=cfg.max_bucket_size,
            max_candidates=cfg.max_candidates,
            threshold=cfg.threshold,
            exact=self._exact,
            index_all=cfg.index_policy == "all",
            first_docnum=first_docnum,
            payloads=queries,
            records=payloads(held.records, self.set_cache, needed),
            older=held.older,
            expiry=expiry,
        )
