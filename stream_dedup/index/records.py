"""Value encodings of document and verdict records.

Document record (``d`` keys)::

    u16 LE id length | id UTF-8 | u16 LE cluster length | cluster id UTF-8 | payload

The payload is what verification compares: the document's verification set, the sorted
distinct high 32 bits of its shingle hashes as uint32 LE (``verify = "exact"``, 4 bytes per
distinct shingle; see :mod:`stream_dedup.core.verify`) or the signature as uint32 LE
(``verify = "signature"``, 4 x num_perm bytes).

Verdict record (``v`` keys): compact JSON ``{"k": "u"|"d", "of", "s", "c", "e"}`` so a
replayed id returns exactly what was emitted the first time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii

from stream_dedup.errors import IndexCorruptError
from stream_dedup.models import Verdict, VerdictKind


@dataclass(slots=True)
class DocRecord:
    """An indexed document as a later document's candidate sees it.

    Not frozen, like the other records built once per document (``Source``,
    ``OutRecord``): a frozen dataclass sets each field through ``object.__setattr__``, which
    made its construction about five times slower; nothing mutates these records.
    """

    doc_id: str
    cluster_id: str
    payload: bytes


def encode_doc(doc_id: str, cluster_id: str, payload: bytes) -> bytes:
    i = doc_id.encode("utf-8", "surrogatepass")
    c = cluster_id.encode("utf-8", "surrogatepass")
    return b"".join((len(i).to_bytes(2, "little"), i, len(c).to_bytes(2, "little"), c, payload))


def decode_doc(raw: bytes) -> DocRecord:
    try:
        n = int.from_bytes(raw[0:2], "little")
        doc_id = raw[2 : 2 + n].decode("utf-8", "surrogatepass")
        pos = 2 + n
        m = int.from_bytes(raw[pos : pos + 2], "little")
        cluster = raw[pos + 2 : pos + 2 + m].decode("utf-8", "surrogatepass")
        return DocRecord(doc_id, cluster, raw[pos + 2 + m :])
    except (UnicodeDecodeError, ValueError) as exc:
        raise IndexCorruptError(f"document record does not parse: {exc}") from exc


def encode_verdict(v: Verdict) -> bytes:
    """The verdict record: the bytes ``json.dumps(body, separators=(",", ":"))`` writes.

    Formatted directly (strings escaped by json's own ASCII escaper, the similarity by
    ``float.__repr__`` as json does), because building an encoder per call cost more than
    the rest of a document's bookkeeping.
    """
    of = "null" if v.duplicate_of is None else encode_basestring_ascii(v.duplicate_of)
    sim = "null" if v.similarity is None else float.__repr__(float(v.similarity))
    return (
        f'{{"k":"{"d" if v.is_duplicate else "u"}","of":{of},"s":{sim},'
        f'"c":{encode_basestring_ascii(v.cluster_id)},"e":{"true" if v.empty else "false"}}}'
    ).encode()


def decode_verdict(doc_id: str, raw: bytes) -> Verdict:
    try:
        body = json.loads(raw)
        kind = VerdictKind.DUPLICATE if body["k"] == "d" else VerdictKind.UNIQUE
        return Verdict(
            doc_id, kind, body["of"], body["s"], body["c"], empty=bool(body["e"]), replayed=True
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise IndexCorruptError(f"verdict record of {doc_id!r} does not parse: {exc}") from exc
