"""The matching pass's numbers turned into verdicts and the batch's index writes.

Documents are taken in batch order, so that a repeat of an id within the batch reads the
verdicts its earlier revisions were just given (see :mod:`.revisions`), and a document
indexed here is a candidate record for the later ones. The writes are staged in the
index's own encodings (:class:`~stream_dedup.index.staged.StagedWrite`); the band
buckets, written in key order apart from the rest, come from
:func:`~stream_dedup.index.bucket_records.bucket_puts`.
"""

from __future__ import annotations

from collections.abc import Sequence

from stream_dedup.core.hashing import U32
from stream_dedup.core.match import I64, Matches
from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup.batch import BatchStats
from stream_dedup.dedup.batch_writes import decided_once
from stream_dedup.dedup.excerpts import Relations
from stream_dedup.dedup.reads import Known
from stream_dedup.index.staged import StagedWrite
from stream_dedup.index.store import DocRecord
from stream_dedup.models import Document, Verdict, VerdictKind

#: The kinds, read once (on Python 3.11 a member looked up on the enum goes through its
#: metaclass, far slower than reading a module global).
_UNIQUE, _DUPLICATE = VerdictKind.UNIQUE, VerdictKind.DUPLICATE


def verdicts_and_writes(
    docs: Sequence[Document],
    sk: Sketch,
    known: Known,
    records: dict[int, DocRecord],
    found: Matches,
    queries: tuple[U32, I64, I64],
    stats: BatchStats,
    relations: Relations | None = None,
) -> tuple[list[Verdict], StagedWrite]:
    """Each document's verdict, and the records and counters its commit writes.

    ``records`` are the candidates' records (the batch's indexed documents are added,
    except in the common batch without repeated ids or containment, built by
    :func:`~.batch_writes.decided_once`);
    ``queries`` the batch's verification payloads as the matching pass took them (flat,
    start, length per live document), stored as they are unless the sketch holds the
    documents' compressed texts (exact verification), which are stored instead;
    ``stats`` counts the replays and revisions; ``relations`` are the live documents'
    containment fields (:mod:`.excerpts`), ``None`` with containment off.
    """
    if not known.repeats:  # the common batch, built list by list
        verdicts, staged = decided_once(docs, sk, known, records, found, queries)
        if relations is not None:
            add_relations(verdicts, staged, sk, relations)
        return verdicts, staged
    return one_by_one(docs, sk, known, records, found, queries, stats, relations)


def add_relations(
    verdicts: list[Verdict], staged: StagedWrite, sk: Sketch, relations: Relations
) -> None:
    """Give the verdicts of a batch built list by list their containment fields, and
    stage their verdict records again with them.

    Containment changes only the fields of the verdicts it names (an excerpt's match and
    similarity are already in the matching pass's arrays): every duplicate and each
    unique document that contains an earlier one, a share of the batch. Adding the fields
    to those records costs less than taking the whole batch a document at a time, as
    containment batches did (~2-4 µs per document on a stream with 20 % excerpts). The
    records are the bytes :meth:`StagedWrite.verdict` stages one at a time.
    """
    live, amend = sk.live, staged.amend
    for p in sorted(relations.relation.keys() | relations.contains.keys()):
        i = live[p]
        verdict = with_relations(verdicts[i], relations, p)
        verdicts[i] = verdict
        amend(verdict)


def one_by_one(
    docs: Sequence[Document],
    sk: Sketch,
    known: Known,
    records: dict[int, DocRecord],
    found: Matches,
    queries: tuple[U32, I64, I64],
    stats: BatchStats,
    relations: Relations | None = None,
) -> tuple[list[Verdict], StagedWrite]:
    """:func:`verdicts_and_writes` a document at a time, in batch order: what a batch
    with repeated ids needs (a repeat reads the verdict staged before it)."""
    xkeys, live_pos, stored, repeats = sk.exact_keys, known.live_pos, known.stored, known.repeats
    matched, sims = found.match.tolist(), found.similarity.tolist()
    given, new_text = found.docnum.tolist(), found.new_text.tolist()
    texts = sk.payloads  # exact verification stores the texts, not the sets
    if not texts:
        q_flat, q_at, q_len = queries
        payload_bytes = q_flat.tobytes()
        starts, sizes = (4 * q_at).tolist(), (4 * q_len).tolist()
    staged = StagedWrite()
    verdicts: list[Verdict] = []
    revision, previous, before = 1, None, None
    for i, doc in enumerate(docs):
        live_at = live_pos[i]
        xkey = None if live_at is None else xkeys[live_at]
        if repeats:  # the id's record as it stands: staged earlier in the batch, or stored
            repeat = repeats.get(i)
            if repeat is not None:
                before = staged.decided(doc.id) or stored[i]
                assert before is not None  # a repeat's id was decided before
                if repeat.replay:
                    verdicts.append(before.replayed(doc.id, repeat.revision, repeat.previous))
                    stats.replayed += 1
                    stats.mismatched_repeats += repeat.differs
                    continue
                revision, previous = repeat.revision, repeat.previous
                stats.revisions += 1
            else:
                revision, previous, before = 1, None, None
        if live_at is None:
            verdict = Verdict(doc.id, _UNIQUE, None, None, doc.id, True, False, revision, previous)
        else:
            p = live_at
            n = matched[p]
            if n < 0:
                verdict = Verdict(
                    doc.id, _UNIQUE, None, None, doc.id, revision=revision, previous=previous
                )
            else:
                rec = records[n]
                verdict = Verdict(
                    doc.id,
                    _DUPLICATE,
                    rec.doc_id,
                    round(sims[p], 6),
                    rec.cluster_id,
                    revision=revision,
                    previous=previous,
                )
            if relations is not None:
                verdict = with_relations(verdict, relations, p)
            num = given[p]
            if num >= 0:
                if texts:
                    records[num] = staged.document(num, doc.id, verdict.cluster_id, texts[p], True)
                else:
                    payload = payload_bytes[starts[p] : starts[p] + sizes[p]]
                    records[num] = staged.document(num, doc.id, verdict.cluster_id, payload)
                if new_text[p]:
                    staged.new_text(xkeys[p], num)
        staged.verdict(verdict, xkey, before)
        verdicts.append(verdict)
    return verdicts, staged


def with_relations(verdict: Verdict, relations: Relations, p: int) -> Verdict:
    """``verdict`` of live document ``p`` with its containment fields."""
    rel = relations.relation.get(p)
    contains = relations.contains.get(p)
    if rel is None and contains is None:
        return verdict
    return Verdict(
        verdict.id,
        verdict.verdict,
        verdict.duplicate_of,
        verdict.similarity,
        verdict.cluster_id,
        revision=verdict.revision,
        previous=verdict.previous,
        relation=None if rel is None else rel[0],
        containment=None if rel is None else rel[1],
        contains=contains,
    )
