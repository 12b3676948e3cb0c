"""A whole batch's document and verdict records, encoded in a few passes.

The bytes are those of :func:`~.records.encode_doc` and :func:`~.records.encode_verdict`
for each document; they are built here list by list (ids encoded once, the text tags of
the batch in one ``hex``, one comprehension per kind of record) because a shared index
builds them inside its lease, where a Python call per record and per field was most of
the deciding (``docs/shared-index.md``, "What is still serial"). Only verdicts decided once
(no revision of an id decided before) are built here: those are nearly every verdict of
a stream; the others take :class:`~.staged.StagedWrite`'s path one by one, and those
with containment's fields are staged again with them (:meth:`~.staged.StagedWrite.amend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii

import numpy as np

from stream_dedup.core.hashing import U64
from stream_dedup.core.match import I64
from stream_dedup.index import keys
from stream_dedup.index.records import encode_doc

__all__ = [
    "BatchRecords",
    "doc_keys",
    "doc_records",
    "doc_values",
    "empty_verdict_records",
    "exact_values",
    "text_tags",
    "verdict_records",
]

_TEXT = 0x8000
#: An exact text's key: ``x`` and a 16-byte digest; its tag is digest bytes 0-7.
_EXACT_KEY_SIZE = 17


def text_tags(exact_keys: Sequence[bytes]) -> list[str]:
    """Each key's :func:`~.records.text_tag`, from one ``hex`` of the batch's digests."""
    if not exact_keys:
        return []
    rows = np.frombuffer(b"".join(exact_keys), dtype=np.uint8).reshape(-1, _EXACT_KEY_SIZE)
    joined = np.ascontiguousarray(rows[:, 1:9]).tobytes().hex()
    return [joined[16 * i : 16 * i + 16] for i in range(len(exact_keys))]


def verdict_records(
    ids: Sequence[str],
    duplicate_of: Sequence[str | None],
    similarity: Sequence[float | None],
    cluster: Sequence[str],
    exact_keys: Sequence[bytes],
) -> tuple[list[bytes], list[bytes]]:
    """The verdict keys and records of non-empty documents decided once (``None`` in
    ``duplicate_of``: unique), each ``encode_verdict``'s bytes."""
    esc = encode_basestring_ascii
    tags = text_tags(exact_keys)
    records = [
        (
            f'{{"k":"u","of":null,"s":null,"c":{esc(c)},"e":false,"t":"{t}"}}'
            if of is None
            else f'{{"k":"d","of":{esc(of)},"s":{float.__repr__(float(s or 0.0))},'
            f'"c":{esc(c)},"e":false,"t":"{t}"}}'
        ).encode()
        for of, s, c, t in zip(duplicate_of, similarity, cluster, tags, strict=True)
    ]
    return [keys.VERDICT + i.encode("utf-8", "surrogatepass") for i in ids], records


def empty_verdict_records(ids: Sequence[str]) -> tuple[list[bytes], list[bytes]]:
    """The verdict keys and records of documents with empty content (unique, no tag)."""
    esc = encode_basestring_ascii
    records = [f'{{"k":"u","of":null,"s":null,"c":{esc(i)},"e":true}}'.encode() for i in ids]
    return [keys.VERDICT + i.encode("utf-8", "surrogatepass") for i in ids], records


def doc_records(
    docnums: Sequence[int],
    ids: Sequence[str],
    cluster: Sequence[str],
    payloads: Sequence[bytes],
    text: bool,
) -> tuple[list[bytes], list[bytes]]:
    """The document keys and records of indexed documents, each ``encode_doc``'s bytes
    (``text``: the payloads are compressed texts)."""
    return doc_keys(docnums), doc_values(ids, cluster, payloads, text)


def doc_values(
    ids: Sequence[str], cluster: Sequence[str], payloads: Sequence[bytes], text: bool
) -> list[bytes]:
    """:func:`doc_records`' records alone: they name no docnum, so a batch decided before
    a shared index's lease builds them there."""
    mark = _TEXT if text else 0
    out: list[bytes] = []
    for i, c, payload in zip(ids, cluster, payloads, strict=True):
        ib = i.encode("utf-8", "surrogatepass")
        cb = ib if c is i else c.encode("utf-8", "surrogatepass")
        if len(cb) >= _TEXT:
            encode_doc(i, c, payload, text)  # raises the error that names the length
        n, m = len(ib), len(cb) | mark
        out.append(b"".join((n.to_bytes(2, "little"), ib, m.to_bytes(2, "little"), cb, payload)))
    return out


def doc_keys(docnums: Sequence[int] | I64) -> list[bytes]:
    """The document keys of ``docnums``: ``d`` and the docnum as 8 bytes big-endian."""
    rows = np.empty((len(docnums), 9), dtype=np.uint8)
    rows[:, 0] = keys.DOC[0]
    rows[:, 1:] = np.asarray(docnums, dtype=">u8").view(np.uint8).reshape(-1, 8)
    out: list[bytes] = rows.view("V9").ravel().tolist()
    return out


def exact_values(docnums: Sequence[int]) -> list[bytes]:
    """The values of new exact texts' records: the first docnum with each text."""
    values: list[bytes] = np.asarray(docnums, dtype="<u8").view("V8").tolist()
    return values


@dataclass(frozen=True, slots=True)
class BatchRecords:
    """A batch's records decided once, kind by kind, in the order its write stages them.

    What :class:`~.staged.StagedWrite` holds after :func:`verdict_records`,
    :func:`doc_records`, :func:`exact_values` and :func:`empty_verdict_records`, kept
    apart: on a shared index the records of a batch decided before the lease are built
    there, and the lease only gives them their docnums (``doc_nums``, ``exact_nums``)
    and builds again those of the documents decided again. A backend that encodes a
    write from its parts (Redis) takes them as they are; any other takes :meth:`puts`.
    """

    verdict_keys: list[bytes]
    verdict_values: list[bytes]
    doc_nums: I64
    doc_values: list[bytes]
    exact_keys: list[bytes]
    exact_nums: I64
    empty_keys: list[bytes]
    empty_values: list[bytes]
    #: The key filter's fingerprints of the verdict, exact-text and empty verdict keys,
    #: in that order (:func:`~.filter.key_fingerprints`).
    fingerprints: U64

    def puts(self) -> dict[bytes, bytes]:
        """The records as one mapping, in the order :class:`~.staged.StagedWrite` stages them."""
        puts = dict(zip(self.verdict_keys, self.verdict_values, strict=True))
        puts.update(zip(doc_keys(self.doc_nums), self.doc_values, strict=True))
        puts.update(zip(self.exact_keys, exact_values(self.exact_nums.tolist()), strict=True))
        puts.update(zip(self.empty_keys, self.empty_values, strict=True))
        return puts
