"""The core composed over an index: a batch of documents in, verdicts out, one commit.

``decide(docs)`` reads the committed index (batched reads, through the index's key filter,
for replayed ids, exact-text digests and band buckets; one for candidate records) and
decides the documents in order against everything before them *including earlier
documents of the same batch*: pending writes live in an overlay that later documents of
the batch read first (for band buckets, :class:`~stream_dedup.buckets.BatchBuckets`,
which looks only at the buckets a batch shares with the index or within itself). Nothing is
written until ``commit(result, offsets)``, which hands all of the batch's records,
counters and the input offsets to one atomic index write. Deciding the same batch again
over the same committed index gives identical verdicts, which is what makes a replay
after a crash emit identical events.

Per document: a replayed id returns its stored verdict; empty normalised content is
``unique`` with ``empty=True`` and never indexed; identical normalised text (exact digest)
is a duplicate with similarity 1.0 of the first document with that text; otherwise the
band buckets give candidates, ranked by shared bands, the first ``max_candidates`` are
verified, and the best verified match at or above the threshold decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from stream_dedup.buckets import BatchBuckets
from stream_dedup.config import DedupConfig
from stream_dedup.errors import IndexCorruptError
from stream_dedup.hashing import U32, U64
from stream_dedup.index import keys
from stream_dedup.index.backend import OrderedPuts
from stream_dedup.index.filter import KeyFilter, bucket_fingerprints
from stream_dedup.index.records import (
    DocRecord,
    decode_doc,
    decode_verdict,
    encode_doc,
    encode_verdict,
)
from stream_dedup.index.store import DedupIndex, PendingCommit
from stream_dedup.models import Document, Verdict, VerdictKind
from stream_dedup.signature import SIG_DTYPE, estimate_jaccard
from stream_dedup.sketch import Sketch, sketch
from stream_dedup.verdict import Match, best_match, jaccard_at_least

#: The kinds, read once (a member looked up on the enum costs ~140 ns on Python 3.11).
_UNIQUE, _DUPLICATE = VerdictKind.UNIQUE, VerdictKind.DUPLICATE


@dataclass(slots=True)
class BatchStats:
    """Work done for one batch, for metrics and the offline summary."""

    candidates: list[int] = field(default_factory=list)
    verifications: list[int] = field(default_factory=list)
    truncated_lookups: int = 0
    bucket_evictions: int = 0
    exact_hits: int = 0
    replayed: int = 0


@dataclass(slots=True)
class BatchResult:
    """Verdicts of a batch plus everything its commit will write.

    ``bucket_puts`` are the band buckets' new contents, in ascending key order (RocksDB
    inserts a run of ascending keys several times faster), apart from the other ``puts``,
    and ``bucket_fingerprints`` their keys' fingerprints for the index's key filter.
    """

    verdicts: list[Verdict]
    puts: dict[bytes, bytes]
    bucket_puts: OrderedPuts
    counter_deltas: dict[str, int]
    stats: BatchStats
    bucket_fingerprints: U64 = field(default_factory=lambda: np.empty(0, dtype=np.uint64))


class Deduplicator:
    """Decides batches of documents against one :class:`DedupIndex`."""

    def __init__(self, index: DedupIndex, config: DedupConfig) -> None:
        self.index = index
        self.config = config
        self.plan = config.band_plan()
        self._exact = config.verify == "exact"
        self._bucket_bytes = 8 * config.max_bucket_size

    def warm_up(self) -> None:
        """Load the compiled kernels now, so the first batch does not wait for them.

        The first call of a compiled kernel loads it from numba's on-disk cache (or
        compiles it, the first time on a machine): close to a second that would otherwise
        land on the latency of the first documents. Deciding a throw-away pair of texts
        (one near-duplicate of the other) runs every kernel the configuration uses; the
        index is read, to build its key filter now, but not written.
        """
        texts = ["warm-up text for the compiled kernels", "warm-up text for the kernels"]
        sk = sketch(texts, self.config, self.plan)
        scratch, fps = KeyFilter(0), bucket_fingerprints(sk.bucket_keys)
        scratch.add(fps)
        scratch.may_hold(fps)
        self.index.load_filter()  # a scan of the index's lookup keys
        if self._exact and len(sk.sets) == 2:
            # Stored sets are read-only buffers: a distinct compiled signature.
            stored = np.frombuffer(sk.sets[1].tobytes(), dtype="<u4")
            jaccard_at_least(sk.sets[0], stored, 0.0)  # 0: sizes cannot skip the merge

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
        """Persist a decided batch (and the input offsets it covers) in one atomic write."""
        self.index.apply(self.prepare(result, offsets))

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
        )

    def sketch(self, docs: Sequence[Document]) -> Sketch:
        """The index-independent part of deciding ``docs`` (see :mod:`stream_dedup.sketch`)."""
        return sketch([d.content for d in docs], self.config, self.plan)

    def decide(self, docs: Sequence[Document], sketched: Sketch | None = None) -> BatchResult:
        """Verdicts for ``docs`` in order; see the module docstring for the rules.

        ``sketched`` is ``docs``' sketch when it was computed elsewhere (the service's
        sketch worker computes it one batch ahead); by default it is computed here.
        """
        cfg = self.config
        sk = sketched if sketched is not None else self.sketch(docs)
        if sk.size != len(docs):
            raise ValueError("the sketch handed in is not the sketch of these documents")
        live, sets, sigs, bkeys, xkeys = sk.live, sk.sets, sk.sigs, sk.bucket_keys, sk.exact_keys
        nb = self.plan.bands

        vkeys = [keys.verdict_key(d.id) for d in docs]
        read = self.index.read_lookups(vkeys + xkeys)
        nv = len(vkeys)
        # Verdicts and exact digests: committed values, overlaid with the batch's writes
        # (an id or a text may repeat within the batch).
        vdb: dict[bytes, bytes | None] = dict(zip(vkeys, read[:nv], strict=True))
        xdb: dict[bytes, bytes | None] = dict(zip(xkeys, read[nv:], strict=True))
        committed = self.index.read_buckets(bkeys, sk.bucket_fingerprints)
        held_at = BatchBuckets(committed, sk.bucket_shared, nb)

        records = self._prefetch_records(xdb.values(), held_at.committed_values())
        next_docnum = self.index.counter("indexed")
        puts: dict[bytes, bytes] = {}
        stats = BatchStats()
        deltas = dict.fromkeys(("documents", "indexed", "duplicates", "empty"), 0)
        verdicts: list[Verdict] = []
        live_pos: list[int | None] = [None] * len(docs)
        for p, doc_index in enumerate(live):
            live_pos[doc_index] = p
        docnum_at = [-1] * len(live)
        index_all = cfg.index_policy == "all"
        bucket_bytes = self._bucket_bytes

        for i, doc in enumerate(docs):
            vkey = vkeys[i]
            stored = vdb[vkey]
            if stored is not None:
                verdicts.append(decode_verdict(doc.id, stored))
                stats.replayed += 1
                stats.candidates.append(0)
                stats.verifications.append(0)
                continue
            pos = live_pos[i]
            if pos is None:
                verdict = Verdict(doc.id, _UNIQUE, None, None, doc.id, empty=True)
                deltas["empty"] += 1
                stats.candidates.append(0)
                stats.verifications.append(0)
            else:
                held = held_at.of(pos)
                xkey = xkeys[pos]
                exact_hit = xdb[xkey]
                hits = [v for _, v in held if v] if held else None
                if exact_hit is None and not hits:  # nothing earlier shares a bucket
                    match, n_cand, n_ver = None, 0, 0
                else:
                    match, n_cand, n_ver = self._match(
                        sets[pos] if self._exact else None,
                        sigs[pos],
                        hits or [],
                        exact_hit,
                        records,
                        stats,
                    )
                stats.candidates.append(n_cand)
                stats.verifications.append(n_ver)
                if match is None:
                    verdict = Verdict(doc.id, _UNIQUE, None, None, doc.id)
                else:
                    verdict = Verdict(
                        doc.id,
                        _DUPLICATE,
                        match.doc_id,
                        round(match.similarity, 6),
                        match.cluster_id,
                    )
                    deltas["duplicates"] += 1
                if index_all or match is None:
                    docnum = next_docnum
                    next_docnum += 1
                    deltas["indexed"] += 1
                    docnum_at[pos] = docnum
                    payload = sets[pos].tobytes() if self._exact else sigs[pos].tobytes()
                    puts[keys.doc_key(docnum)] = encode_doc(doc.id, verdict.cluster_id, payload)
                    records[docnum] = DocRecord(doc.id, verdict.cluster_id, payload)
                    if exact_hit is None:
                        puts[xkey] = xdb[xkey] = docnum.to_bytes(8, "little")
                    if held:
                        stats.bucket_evictions += held_at.append(held, docnum, bucket_bytes)
            deltas["documents"] += 1
            puts[vkey] = vdb[vkey] = encode_verdict(verdict)
            verdicts.append(verdict)
        bucket_puts, written = held_at.puts(bkeys, sk.bucket_order, docnum_at)
        fps = sk.bucket_fingerprints[written]
        return BatchResult(verdicts, puts, bucket_puts, deltas, stats, fps)

    def _prefetch_records(
        self, exact: Iterable[bytes | None], buckets: list[bytes]
    ) -> dict[int, DocRecord]:
        """Fetch, in one read, the records of every committed document a bucket names."""
        wanted = {int.from_bytes(raw, "little") for raw in exact if raw is not None}
        if buckets:
            members = np.frombuffer(b"".join(buckets), dtype="<u8")
            wanted.update(np.unique(members).tolist())
        return self._fetch_records(sorted(wanted))

    def _fetch_records(self, docnums: list[int]) -> dict[int, DocRecord]:
        raw = self.index.read([keys.doc_key(n) for n in docnums])
        out: dict[int, DocRecord] = {}
        for n, value in zip(docnums, raw, strict=True):
            if value is None:
                raise IndexCorruptError(f"bucket names document {n}, which has no record")
            out[n] = decode_doc(value)
        return out

    def _match(
        self,
        shingles: U32 | None,
        sig: U32,
        hits: list[bytes],
        exact_hit: bytes | None,
        records: dict[int, DocRecord],
        stats: BatchStats,
    ) -> tuple[Match | None, int, int]:
        """Best verified earlier match of one document, candidates seen, verifications.

        ``hits`` are the values of the document's non-empty band buckets.
        """
        if exact_hit is not None:
            n = int.from_bytes(exact_hit, "little")
            rec = records.get(n) or self._fetch_records([n])[n]
            stats.exact_hits += 1
            return Match(n, rec.doc_id, rec.cluster_id, 1.0), 1, 0
        if not hits:
            return None, 0, 0
        members = np.frombuffer(b"".join(hits), dtype="<u8")
        chosen = set(members.tolist())
        n_cand = len(chosen)
        if n_cand > self.config.max_candidates:
            stats.truncated_lookups += 1
            unique, counts = np.unique(members, return_counts=True)
            order = np.lexsort((unique, -counts))[: self.config.max_candidates]
            chosen = set(unique[order].tolist())
        missing = [n for n in chosen if n not in records]
        if missing:
            records.update(self._fetch_records(missing))
        threshold = self.config.threshold
        matches = []
        for n in chosen:
            rec = records[n]
            if shingles is not None:
                # None: below the threshold, which is all best_match needs to know.
                sim = jaccard_at_least(shingles, np.frombuffer(rec.payload, dtype="<u4"), threshold)
                if sim is None:
                    continue
            else:
                sim = estimate_jaccard(sig, np.frombuffer(rec.payload, dtype=SIG_DTYPE))
            matches.append(Match(n, rec.doc_id, rec.cluster_id, sim))
        return best_match(matches, threshold), n_cand, len(chosen)
