"""A batch's writes, staged in the index's own encodings, and the verdicts it reads back.

The deduplicator decides a batch and states what it decided in typed terms (a verdict, an
indexed document, a new exact text); :class:`StagedWrite` turns each into the index's
keys and records (:mod:`.keys`, :mod:`.records`) for the batch's one commit
(:meth:`~stream_dedup.index.store.DedupIndex.prepare`). A verdict read back, from the index
or from earlier in the same batch, is a :class:`StoredVerdict`: the caller asks it for the
replayed verdict and never sees its bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stream_dedup.index import keys
from stream_dedup.index.records import (
    REVISION_SEP,
    DocRecord,
    decode_revision,
    encode_doc,
    encode_verdict,
    text_of,
    with_containment_fields,
)
from stream_dedup.models import Verdict

__all__ = ["COUNTERS", "DocRecord", "StagedWrite", "StoredVerdict", "text_of"]

#: Counters kept in the index, updated in the same write as the records they count.
COUNTERS = ("documents", "indexed", "duplicates", "empty")


class StoredVerdict:
    """The verdicts an id was given, one per revision, as stored (see :mod:`.records`)."""

    __slots__ = ("_raw", "_revisions")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._revisions = raw.split(REVISION_SEP)

    def texts(self, doc_id: str) -> list[str | None]:
        """The text of each revision, oldest first (see :func:`records.text_of`; ``None``:
        unknown, a record of the older format without tags)."""
        return [decode_revision(doc_id, raw)[1] for raw in self._revisions]

    def replayed(self, doc_id: str, revision: int, previous: str | None) -> Verdict:
        """The stored verdict of ``doc_id``'s ``revision`` (1 for the first), marked
        replayed; ``previous`` is the text of the revision before it, as the event says."""
        return decode_revision(doc_id, self._revisions[revision - 1], revision, previous)[0]

    def extended(self, raw: bytes) -> bytes:
        """The record with one more revision, ``raw`` (its verdict object), at the end."""
        return self._raw + REVISION_SEP + raw


class StagedWrite:
    """The records and counter changes of one batch, in the order they were decided.

    ``puts`` and ``counters`` are what :meth:`DedupIndex.prepare` takes. A document's
    records go in as it is decided (its document record, its exact text, then its
    verdict), so a later repeat of its id in the same batch reads its verdict back here.
    """

    __slots__ = ("counters", "puts")

    def __init__(self) -> None:
        self.puts: dict[bytes, bytes] = {}
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def verdict(
        self, verdict: Verdict, exact_key: bytes | None, before: StoredVerdict | None = None
    ) -> None:
        """Store the verdict of a document decided in this batch (``exact_key``: its
        exact-text key, ``None`` for empty content), and count it. ``before`` is its id's
        record as it stands (from the index or earlier in the batch) when the document is a
        new revision: the verdict is added to it as the last revision."""
        counters = self.counters
        counters["documents"] += 1
        if verdict.is_duplicate:
            counters["duplicates"] += 1
        elif verdict.empty:
            counters["empty"] += 1
        raw = encode_verdict(verdict, exact_key)
        self.puts[keys.verdict_key(verdict.id)] = raw if before is None else before.extended(raw)

    def amend(self, verdict: Verdict) -> None:
        """Stage ``verdict`` in place of the verdict of the same id, decided once and
        already staged (and counted) in this batch without containment's fields, which
        ``verdict`` adds (the batch's records were built list by list before them)."""
        key = keys.verdict_key(verdict.id)
        self.puts[key] = with_containment_fields(self.puts[key], verdict)

    def decided(self, doc_id: str) -> StoredVerdict | None:
        """The record staged for ``doc_id`` earlier in this batch (``None``: none), every
        revision of the id it holds included."""
        raw = self.puts.get(keys.verdict_key(doc_id))
        return None if raw is None else StoredVerdict(raw)

    def document(
        self, docnum: int, doc_id: str, cluster_id: str, payload: bytes, text: bool = False
    ) -> DocRecord:
        """Index a document under ``docnum``; its record, as a later candidate reads it.
        ``text``: the payload is compressed text (see :mod:`~stream_dedup.index.records`)."""
        self.counters["indexed"] += 1
        self.puts[keys.doc_key(docnum)] = encode_doc(doc_id, cluster_id, payload, text)
        return DocRecord(doc_id, cluster_id, payload, text)

    def new_text(self, exact_key: bytes, docnum: int) -> None:
        """Name ``docnum`` the first document with the text of ``exact_key``."""
        self.puts[exact_key] = docnum.to_bytes(8, "little")

    def records(self, record_keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Stage records built for the whole batch at once (:mod:`.batch_records`)."""
        self.puts.update(zip(record_keys, values, strict=True))

    def count(self, counts: Mapping[str, int]) -> None:
        """Count documents decided by the batch at once (:data:`COUNTERS`' names)."""
        for name, n in counts.items():
            self.counters[name] += n
