"""Value encodings of document and verdict records.

Document record (``d`` keys)::

    u16 LE id length | id UTF-8 | u16 LE cluster length | cluster id UTF-8 | payload

(the cluster length's top bit, 0x8000, set: the payload is text)

The payload is what verification compares. With ``verify = "exact"`` it is, from index
format 4 on, the document's normalised text compressed (see
:mod:`stream_dedup.core.payload`), marked by the top bit of the cluster length; records of
formats 2 and 3 hold the verification set itself, the sorted distinct high 32 bits of the shingle
hashes as uint32 LE (4 bytes per distinct shingle, :mod:`stream_dedup.core.verify`), and
still decode, so an index of either format, or of both, decides the same. With
``verify = "signature"`` it is the signature as uint32 LE (4 x num_perm bytes).

Verdict record (``v`` keys): compact JSON ``{"k": "u"|"d", "of", "s", "c", "e", "t"}`` so
a replayed id returns exactly what was emitted the first time. ``"t"``, the text tag (see
:func:`text_tag`), says which normalised text the id was decided on, so a repeat of the id
with other text can be told apart; it is absent for empty content and from records of
the older format without it, which still decode.

An id decided on more than one text (its *revisions*, see ``docs/revisions.md``) keeps one
such object per revision, oldest first, joined by ``\n`` (:data:`REVISION_SEP`: the
objects are ASCII JSON with every control character escaped, so they never hold one). The
record of an id with one revision is that one object, as in format 2, so an index of
format 2 reads as revision 1 of each id.
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
    makes its construction several times slower; nothing mutates these records.
    """

    doc_id: str
    cluster_id: str
    payload: bytes
    #: The payload is compressed text (format 4), not a verification set or signature.
    text: bool = False


#: Top bit of the cluster length: the payload is compressed text. Cluster ids are
#: document ids, far below 32 KiB, so the bit was never set by formats 2 and 3.
_TEXT = 0x8000


def encode_doc(doc_id: str, cluster_id: str, payload: bytes, text: bool = False) -> bytes:
    i = doc_id.encode("utf-8", "surrogatepass")
    c = cluster_id.encode("utf-8", "surrogatepass")
    if len(c) >= _TEXT:
        raise ValueError(f"cluster id of {len(c)} bytes: at most {_TEXT - 1}")
    size = len(c) | _TEXT if text else len(c)
    return b"".join((len(i).to_bytes(2, "little"), i, size.to_bytes(2, "little"), c, payload))


def decode_doc(raw: bytes) -> DocRecord:
    try:
        n = int.from_bytes(raw[0:2], "little")
        doc_id = raw[2 : 2 + n].decode("utf-8", "surrogatepass")
        pos = 2 + n
        m = int.from_bytes(raw[pos : pos + 2], "little")
        text = m >= _TEXT
        m &= _TEXT - 1
        cluster = raw[pos + 2 : pos + 2 + m].decode("utf-8", "surrogatepass")
        return DocRecord(doc_id, cluster, raw[pos + 2 + m :], text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise IndexCorruptError(f"document record does not parse: {exc}") from exc


def text_tag(exact_key: bytes) -> str:
    """The text tag of a document: hex of the first 8 bytes of its exact-text digest.

    ``exact_key`` is the document's exact-text key (``x`` + the 16-byte digest of its
    normalised text, :func:`stream_dedup.core.lookup_keys.exact_key`), which the sketch
    computes anyway. Eight bytes tell two texts apart with a chance of a collision
    around 2**-64 per pair, at 22 bytes per verdict record.
    """
    return exact_key[1:9].hex()


def encode_verdict(v: Verdict, exact_key: bytes | None = None) -> bytes:
    """The verdict record: the bytes ``json.dumps(body, separators=(",", ":"))`` writes.

    ``exact_key`` is the document's exact-text key, stored as its :func:`text_tag`
    (``None`` for empty content, which has none). Formatted directly (strings escaped by
    json's own ASCII escaper, the similarity by ``float.__repr__`` as json does), because
    building an encoder per call cost more than the rest of a document's bookkeeping.
    """
    of = "null" if v.duplicate_of is None else encode_basestring_ascii(v.duplicate_of)
    sim = "null" if v.similarity is None else float.__repr__(float(v.similarity))
    tag = "" if exact_key is None else f',"t":"{exact_key[1:9].hex()}"'  # text_tag, inlined
    return (
        f'{{"k":"{"d" if v.is_duplicate else "u"}","of":{of},"s":{sim},'
        f'"c":{encode_basestring_ascii(v.cluster_id)},"e":{"true" if v.empty else "false"}'
        f"{tag}{_containment_fields(v)}}}"
    ).encode()


def with_containment_fields(raw: bytes, v: Verdict) -> bytes:
    """:func:`encode_verdict`'s record of ``v``, from ``raw``, the record of ``v`` without
    its containment fields: they are the record's last fields, so they go in before its
    closing brace, and the fields before them are not formatted again."""
    return raw[:-1] + _containment_fields(v).encode() + b"}"


def _containment_fields(v: Verdict) -> str:
    """The containment fields of a verdict record (relation ``r``, containment ``ct``,
    contained document ``in``): nothing when containment is off, so such records are the
    bytes they always were."""
    out = ""
    if v.relation is not None:
        share = float.__repr__(float(v.containment or 0.0))
        out += f',"r":{encode_basestring_ascii(v.relation)},"ct":{share}'
    if v.contains is not None:
        out += f',"in":[{encode_basestring_ascii(v.contains[0])},{float.__repr__(v.contains[1])}]'
    return out


#: Separates the revisions of one id in its verdict record.
REVISION_SEP = b"\n"

#: The text of empty content, as a revision's text (no exact-text key, so no tag).
EMPTY_TEXT = ""


def text_of(exact_key: bytes | None) -> str:
    """What tells a document's text apart from the other revisions of its id: its
    :func:`text_tag`, or :data:`EMPTY_TEXT` for empty content (``exact_key`` ``None``)."""
    return EMPTY_TEXT if exact_key is None else exact_key[1:9].hex()


def decode_revision(
    doc_id: str, raw: bytes, revision: int = 1, previous: str | None = None
) -> tuple[Verdict, str | None]:
    """One revision's stored verdict, marked replayed and numbered ``revision`` (after a
    revision of text ``previous``), and the text it was decided on (:func:`text_of`;
    ``None``: unknown, a record of the older format without tags)."""
    try:
        body = json.loads(raw)
        kind = VerdictKind.DUPLICATE if body["k"] == "d" else VerdictKind.UNIQUE
        empty = bool(body["e"])
        verdict = Verdict(
            doc_id,
            kind,
            body["of"],
            body["s"],
            body["c"],
            empty=empty,
            replayed=True,
            revision=revision,
            previous=previous,
            relation=body.get("r"),
            containment=body.get("ct"),
            contains=tuple(body["in"]) if "in" in body else None,
        )
        text: str | None = EMPTY_TEXT if empty else body.get("t")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IndexCorruptError(f"verdict record of {doc_id!r} does not parse: {exc}") from exc
    return verdict, text


def decode_verdict(doc_id: str, raw: bytes) -> Verdict:
    """The stored verdict of ``doc_id``, marked replayed."""
    return decode_replay(doc_id, raw, None)[0]


def decode_replay(doc_id: str, raw: bytes, exact_key: bytes | None) -> tuple[Verdict, bool]:
    """The stored verdict of a one-revision record, and whether a repeat's text differs.

    ``exact_key`` is the repeat's exact-text key (``None``: its content is empty). The
    texts differ when the record's text (:func:`text_of`) is not the repeat's. A record
    without a tag whose content was not empty is of the older format without tags: its
    text is unknown, and the repeat is not counted as different.
    """
    verdict, text = decode_revision(doc_id, raw)
    return verdict, text is not None and text != text_of(exact_key)
