"""A batch's writes, staged in the index's own encodings, and the verdicts it reads back.

The deduplicator decides a batch and states what it decided in typed terms (a verdict, an
indexed document, a new exact text); :class:`StagedWrite` turns each into the index's
keys and records (:mod:`.keys`, :mod:`.records`) for the batch's one commit
(:meth:`~stream_dedup.index.store.DedupIndex.prepare`). A verdict read back, from the index
or from earlier in the same batch, is a :class:`StoredVerdict`: the caller asks it for the
replayed verdict and never sees its bytes.
"""

from __future__ import annotations

from stream_dedup.index import keys
from stream_dedup.index.records import DocRecord, decode_replay, encode_doc, encode_verdict
from stream_dedup.models import Verdict

__all__ = ["COUNTERS", "DocRecord", "StagedWrite", "StoredVerdict"]

#: Counters kept in the index, updated in the same write as the records they count.
COUNTERS = ("documents", "indexed", "duplicates", "empty")


class StoredVerdict:
    """The verdict an id was given, as stored (see :func:`records.decode_replay`)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def replayed(self, doc_id: str, exact_key: bytes | None) -> tuple[Verdict, bool]:
        """The stored verdict of ``doc_id``, marked replayed, and whether the repeat's text
        (``exact_key``: its exact-text key, ``None`` for empty content) differs from the
        text the id was first decided on."""
        return decode_replay(doc_id, self._raw, exact_key)


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

    def verdict(self, verdict: Verdict, exact_key: bytes | None) -> None:
        """Store the verdict of a document decided in this batch (``exact_key``: its
        exact-text key, ``None`` for empty content), and count it."""
        counters = self.counters
        counters["documents"] += 1
        if verdict.is_duplicate:
            counters["duplicates"] += 1
        elif verdict.empty:
            counters["empty"] += 1
        self.puts[keys.verdict_key(verdict.id)] = encode_verdict(verdict, exact_key)

    def decided(self, doc_id: str) -> StoredVerdict:
        """The verdict staged for ``doc_id`` earlier in this batch."""
        return StoredVerdict(self.puts[keys.verdict_key(doc_id)])

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
