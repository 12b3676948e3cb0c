"""The core composed over an index: a batch of documents in, verdicts out, one commit.

``decide(docs)`` reads the committed index (batched reads, through the index's key filter,
for replayed ids, exact-text digests and band buckets; one for candidate records) and
decides the documents in order against everything before them *including earlier
documents of the same batch*: the compiled matching pass
(:mod:`stream_dedup.core.match`) keeps the batch's own bucket appends and exact texts
beside what the index holds, so later documents of the batch see them. Nothing is
written until ``commit(result, offsets)``, which hands all of the batch's records,
counters and the input offsets to one atomic index write. Deciding the same batch again
over the same committed index gives identical verdicts, which is what makes a replay
after a crash emit identical events.

Per document: a replayed id returns its stored verdict (a repeat whose normalised text
differs from the first occurrence's is counted in ``BatchStats.mismatched_repeats``);
empty normalised content is ``unique`` with ``empty=True`` and never indexed; identical
normalised text (exact digest) is a duplicate with similarity 1.0 of the first document
with that text; otherwise the band buckets give candidates, ranked by shared bands, the
first ``max_candidates`` are verified, and the best verified match at or above the
threshold decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stream_dedup.core import lookup_keys as _lookup_keys
from stream_dedup.core import match as _match
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.hashing import U32, U64
from stream_dedup.core.match import I64, NO_CLOCK, Expiry, Matches, match_batch
from stream_dedup.core.sketch import Sketch, sketch
from stream_dedup.errors import IndexCorruptError
from stream_dedup.index import keys
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.records import (
    DocRecord,
    decode_doc,
    decode_replay,
    encode_doc,
    encode_verdict,
)
from stream_dedup.index.store import DedupIndex, PendingCommit
from stream_dedup.models import Document, Verdict, VerdictKind

#: The kinds, read once (on Python 3.11 a member looked up on the enum goes through its
#: metaclass, far slower than reading a module global).
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
    #: Replayed ids whose normalised text differs from the first occurrence's (they get
    #: the first occurrence's verdict all the same).
    mismatched_repeats: int = 0


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
    #: The epoch the batch writes to, its clock change points (docnums, clocks) and the
    #: stream's clock after it (see :mod:`stream_dedup.index.retention`); ``None``: as
    #: the index is (an empty batch).
    epoch: int | None = None
    points: tuple[I64, I64] | None = None
    clock: int | None = None


#: Said before the first batch when the compiled kernels are not in numba's cache yet.
COMPILING_NOTICE = (
    "compiling the detector's kernels (first run after install, up to ~15 s; "
    "later runs load them from the cache)"
)


def kernels_cached() -> bool:
    """Whether numba's on-disk cache holds the kernels that every batch runs.

    When it does not (the first run after an install or upgrade, or a cleared cache), the
    first batch compiles them, a long pause with nothing to show for it, which callers announce
    with :data:`COMPILING_NOTICE`. The check asks for the cache index (``*.nbi``) of the
    matching pass and of the key fingerprints, the two kernels every configuration runs,
    where numba's own locator puts it (``__pycache__`` beside the module, or under
    ``NUMBA_CACHE_DIR``): one ``stat`` each. Should numba's internals move, it answers
    True, as a missing notice costs less than a false one on every run.
    """
    for kernel in (_match._match_batch, _lookup_keys._fingerprints):
        try:
            index = Path(kernel._cache._cache_file._index_path)
        except (AttributeError, TypeError):
            return True
        if not index.exists():
            return False
    return True


class Deduplicator:
    """Decides batches of documents against one :class:`DedupIndex`."""

    def __init__(self, index: DedupIndex, config: DedupConfig) -> None:
        self.index = index
        self.config = config
        self.plan = config.band_plan()
        self._exact = config.verify == "exact"
        self._bucket_bytes = 8 * config.max_bucket_size

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
        texts = ["warm-up text for the compiled kernels", "warm-up text for the kernels"]
        if notice is not None and not kernels_cached():
            notice(COMPILING_NOTICE)
        self.decide([Document(f"\x00warm-up {i}", t) for i, t in enumerate(texts)])

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
            epoch=result.epoch,
            points=result.points,
            clock=result.clock,
        )

    def sketch(self, docs: Sequence[Document]) -> Sketch:
        """The index-independent part of deciding ``docs`` (see :mod:`stream_dedup.core.sketch`)."""
        return sketch([d.content for d in docs], self.config, self.plan)

    def decide(self, docs: Sequence[Document], sketched: Sketch | None = None) -> BatchResult:
        """Verdicts for ``docs`` in order; see the module docstring for the rules.

        ``sketched`` is ``docs``' sketch when it was computed elsewhere (the service's
        sketch worker computes it one batch ahead); by default it is computed here. The
        matching itself is one compiled pass (:func:`~stream_dedup.core.match.match_batch`);
        this method gathers its inputs from the index and turns its numbers into verdicts
        and records.
        """
        cfg = self.config
        sk = sketched if sketched is not None else self.sketch(docs)
        if sk.size != len(docs):
            raise ValueError("the sketch handed in is not the sketch of these documents")
        live, xkeys, bkeys = sk.live, sk.exact_keys, sk.bucket_keys
        n_docs, n_live, nb = len(docs), len(live), self.plan.bands

        vkeys = [keys.verdict_key(d.id) for d in docs]
        read = self.index.read_lookups(vkeys + xkeys)
        stored, xread = read[:n_docs], read[n_docs:]
        # An id repeated within the batch is decided once, at its first occurrence; the
        # later ones, like an id the index has decided before, get that verdict back.
        first_at = dict(zip(reversed(vkeys), range(n_docs - 1, -1, -1), strict=True))
        live_pos: list[int | None] = [None] * n_docs
        for p, doc_index in enumerate(live):
            live_pos[doc_index] = p
        fresh = np.ones(n_live, dtype=bool)
        if len(first_at) < n_docs or stored.count(None) < n_docs:
            for i, vkey in enumerate(vkeys):
                at_live = live_pos[i]
                if at_live is not None and (stored[i] is not None or first_at[vkey] != i):
                    fresh[at_live] = False
        text_group, group_docnum = _text_groups(xkeys, xread)
        epoch = self.index.batch_epoch()
        present = self.index.read_buckets_present(bkeys, sk.bucket_fingerprints)
        mine = [(at, held) for e, at, held in present if e == epoch]
        older = [(at, held) for e, at, held in present if e != epoch]
        at, held = mine[0] if mine else ([], [])
        slot, committed = _bucket_slots(len(bkeys), sk.bucket_shared, at, held)
        old = _older_members(len(bkeys), slot, older) if older else None

        cutoff = self.index.cutoff()  # nothing older is held by any document of the batch
        wanted = set(group_docnum[group_docnum >= cutoff].tolist())
        members = [committed[2]] if old is None else [committed[2], old[2]]
        wanted.update(m for m in np.unique(np.concatenate(members)).tolist() if m >= cutoff)
        records = self._fetch_records(sorted(wanted))
        first_docnum = self.index.counter("indexed")
        timeline = self.index.timeline
        doc_clock = _clocks(docs, timeline.clock)
        retention = self.index.retention
        expiry = Expiry(
            doc_clock[live] if n_live else np.empty(0, np.int64),
            timeline.points_doc,
            timeline.points_clock,
            retention.window,
            retention.max_documents,
            epoch != timeline.current.number,
        )
        if self._exact:
            q_flat, q_at, q_len = sk.set_flat, sk.set_at, sk.set_len
        else:
            per = cfg.num_perm
            q_flat = sk.sigs.reshape(-1)
            q_at = np.arange(n_live, dtype=np.int64) * per
            q_len = np.full(n_live, per, dtype=np.int64)
        found = match_batch(
            fresh=fresh,
            text_group=text_group,
            group_docnum=group_docnum,
            slot=slot,
            committed=committed,
            bands=nb,
            max_members=cfg.max_bucket_size,
            max_candidates=cfg.max_candidates,
            threshold=cfg.threshold,
            exact=self._exact,
            index_all=cfg.index_policy == "all",
            first_docnum=first_docnum,
            payloads=(q_flat, q_at, q_len),
            records=_payloads(records),
            older=old,
            expiry=expiry,
        )

        stats = BatchStats(
            exact_hits=found.exact_hits,
            truncated_lookups=found.truncated,
            bucket_evictions=found.evictions,
        )
        per_doc = np.zeros((2, n_docs), dtype=np.int64)
        per_doc[0, live] = found.candidates
        per_doc[1, live] = found.verifications
        stats.candidates, stats.verifications = per_doc.tolist()
        matched, sims = found.match.tolist(), found.similarity.tolist()
        given, new_text = found.docnum.tolist(), found.new_text.tolist()
        payload_bytes = q_flat.tobytes()
        starts, sizes = (4 * q_at).tolist(), (4 * q_len).tolist()
        puts: dict[bytes, bytes] = {}
        deltas = dict.fromkeys(("documents", "indexed", "duplicates", "empty"), 0)
        verdicts: list[Verdict] = []
        for i, doc in enumerate(docs):
            vkey = vkeys[i]
            replay = stored[i]
            if replay is None and first_at[vkey] != i:
                replay = puts[vkey]  # what its first occurrence was given
            live_at = live_pos[i]
            xkey = None if live_at is None else xkeys[live_at]
            if replay is not None:
                verdict, differs = decode_replay(doc.id, replay, xkey)
                verdicts.append(verdict)
                stats.replayed += 1
                stats.mismatched_repeats += differs
                continue
            if live_at is None:
                verdict = Verdict(doc.id, _UNIQUE, None, None, doc.id, empty=True)
                deltas["empty"] += 1
            else:
                p = live_at
                n = matched[p]
                if n < 0:
                    verdict = Verdict(doc.id, _UNIQUE, None, None, doc.id)
                else:
                    rec = records[n]
                    verdict = Verdict(
                        doc.id, _DUPLICATE, rec.doc_id, round(sims[p], 6), rec.cluster_id
                    )
                    deltas["duplicates"] += 1
                num = given[p]
                if num >= 0:
                    deltas["indexed"] += 1
                    payload = payload_bytes[starts[p] : starts[p] + sizes[p]]
                    puts[keys.doc_key(num)] = encode_doc(doc.id, verdict.cluster_id, payload)
                    records[num] = DocRecord(doc.id, verdict.cluster_id, payload)
                    if new_text[p]:
                        puts[xkeys[p]] = num.to_bytes(8, "little")
            deltas["documents"] += 1
            puts[vkey] = encode_verdict(verdict, xkey)
            verdicts.append(verdict)
        bucket_puts, written = _bucket_puts(bkeys, sk.bucket_order, slot, found, nb)
        fps = sk.bucket_fingerprints[written]
        clock = int(doc_clock[-1]) if n_docs else timeline.clock
        points = (found.points_doc, found.points_clock)
        return BatchResult(verdicts, puts, bucket_puts, deltas, stats, fps, epoch, points, clock)

    def _fetch_records(self, docnums: list[int]) -> dict[int, DocRecord]:
        raw = self.index.read_documents(docnums)
        out: dict[int, DocRecord] = {}
        for n, value in zip(docnums, raw, strict=True):
            if value is None:
                raise IndexCorruptError(f"bucket names document {n}, which has no record")
            out[n] = decode_doc(value)
        return out


def _text_groups(
    xkeys: list[bytes], committed: list[bytes | None]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each live document's exact-text group (equal normalised texts share one: the last
    position with that text) and each group's committed docnum, -1 where the index holds
    none (``committed``: what the index read for each of ``xkeys``)."""
    last_with = dict(zip(xkeys, range(len(xkeys)), strict=True))
    group = np.array([last_with[x] for x in xkeys], dtype=np.int64)
    docnum = np.full(len(xkeys), -1, dtype=np.int64)
    for p, raw in enumerate(committed):
        if raw is not None:
            docnum[group[p]] = int.from_bytes(raw, "little")
    return group, docnum


def _clocks(docs: Sequence[Document], committed: int) -> I64:
    """The stream's clock as each of ``docs`` is decided: the latest time so far, in whole
    seconds, starting from the ``committed`` clock (``NO_CLOCK`` while none is known)."""
    seconds = np.fromiter(
        (NO_CLOCK if d.time is None else d.time // 1000 for d in docs),
        dtype=np.int64,
        count=len(docs),
    )
    if not seconds.size:
        return seconds
    seconds[0] = max(int(seconds[0]), committed)
    return np.maximum.accumulate(seconds)


def _older_members(
    n_keys: int, slot: npt.NDArray[np.intp], older: list[tuple[list[int], list[bytes]]]
) -> tuple[I64, I64, npt.NDArray[np.uint64]]:
    """The members older live epochs hold per bucket key, as ``(at, len, members)``
    (epochs oldest first, each :meth:`DedupIndex.read_buckets_present`'s ``at``/``held``),
    joined per key; a key shared by several positions is read at its slot."""
    pos = np.concatenate([np.asarray(at, dtype=np.int64) for at, _ in older])
    raws = [raw for _, held in older for raw in held]
    order = np.argsort(pos, kind="stable").tolist()  # per key, epochs stay oldest first
    joined = b"".join([raws[i] for i in order])
    sizes = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws)) >> 3
    lengths = np.bincount(pos, weights=sizes, minlength=n_keys).astype(np.int64)
    at_ = np.cumsum(lengths) - lengths
    # A repeated key reads at its first position (its slot), as committed members do.
    return at_[slot], lengths[slot], np.frombuffer(joined, dtype="<u8")


def _bucket_slots(
    n_keys: int, shared: npt.NDArray[np.intp], at: list[int], held: list[bytes]
) -> tuple[npt.NDArray[np.intp], tuple[I64, I64, npt.NDArray[np.uint64]]]:
    """The slot of every bucket key (the first position with the same key; ``shared``:
    :attr:`Sketch.bucket_shared`) and the committed members per key as ``(at, len,
    members)`` (``at``/``held``: :meth:`DedupIndex.read_buckets_present`)."""
    slot = np.arange(n_keys, dtype=np.intp)
    slot[shared[:, 0]] = shared[:, 1]
    lengths = np.fromiter(map(len, held), dtype=np.int64, count=len(held)) >> 3
    com_len = np.zeros(n_keys, dtype=np.int64)
    com_at = np.zeros(n_keys, dtype=np.int64)
    com_len[at] = lengths
    com_at[at] = np.cumsum(lengths) - lengths
    return slot, (com_at, com_len, np.frombuffer(b"".join(held), dtype="<u8"))


def _payloads(
    records: dict[int, DocRecord],
) -> tuple[npt.NDArray[np.uint64], U32, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The verification payloads of ``records`` as :func:`match_batch` takes them (docnums
    ascending: ``records`` is filled in that order)."""
    docnums = np.fromiter(records, dtype=np.uint64, count=len(records))
    payloads = [r.payload for r in records.values()]
    flat = np.frombuffer(b"".join(payloads), dtype="<u4")
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads)) >> 2
    return docnums, flat, np.cumsum(lengths) - lengths, lengths


def _bucket_puts(
    bkeys: list[bytes],
    order: npt.NDArray[np.intp],
    slot: npt.NDArray[np.intp],
    found: Matches,
    bands: int,
) -> tuple[OrderedPuts, npt.NDArray[np.intp]]:
    """The bucket writes of the batch's indexed documents, in key order, and the positions
    in ``bkeys`` of the keys written.

    ``order`` is the keys' ascending order (:func:`stream_dedup.index.keys.bucket_order`).
    Each bucket is written once: a new bucket of one member is that docnum's eight bytes
    (one vectorised pass), any other its final contents from the matching pass.
    """
    per_key = np.repeat(found.docnum, bands)
    chosen = order[per_key[order] >= 0]
    if chosen.size == 0:
        return NO_ORDERED_PUTS, chosen
    # Equal keys sit side by side in key order: keep the first of each run.
    slots = slot[chosen]
    first = np.ones(chosen.size, dtype=bool)
    first[1:] = slots[1:] != slots[:-1]
    chosen, slots = chosen[first], slots[first]
    values: list[bytes] = per_key[chosen].astype("<u8").view("V8").tolist()
    longer = np.flatnonzero(found.content_len[slots] > 0)
    if longer.size:
        raw = found.contents.astype("<u8").tobytes()  # docnums are never negative
        at = (8 * found.content_at[slots[longer]]).tolist()
        size = (8 * found.content_len[slots[longer]]).tolist()
        for k, a, n in zip(longer.tolist(), at, size, strict=True):
            values[k] = raw[a : a + n]
    return OrderedPuts(_in_order(bkeys, chosen), values), chosen


def _in_order(items: list[bytes], order: npt.NDArray[np.intp]) -> Sequence[bytes]:
    """``items`` at the positions ``order`` lists (``operator.itemgetter``: no Python loop)."""
    if order.size < 2:
        return [items[j] for j in order.tolist()]
    picked: tuple[bytes, ...] = itemgetter(*order.tolist())(items)
    return picked
