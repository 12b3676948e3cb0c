"""Byte layout of the index's keys. One prefix byte per kind of record::

    M                                   -> IndexParams JSON (format version and parameters)
    C <name>                            -> counter, uint64 little-endian
    b <band: u16 BE> <band hash: u64 BE> -> bucket: docnums, uint64 little-endian, oldest first
    d <docnum: u64 BE>                  -> document record (see records.py)
    v <id, UTF-8>                       -> verdict record of a decided id (replay)
    x <16-byte digest of normalised text> -> docnum of the first document with that text
    o <topic, UTF-8> 0x00 <partition: u32 BE> -> next input offset to consume, uint64 LE
    i                                   -> batch intent: JSON [[topic, partition, start, end], ...]
                                           of the batch being emitted; empty once committed
    E                                   -> epoch table and stream clock (retention.py), JSON
    R                                   -> the retention in force (retention.py), JSON
    k <first docnum of a batch: u64 BE> -> the batch's clock change points (retention.py)
    Z                                   -> id of the dictionary new payloads use, u32 LE
    Z <id: u32 BE>                      -> a trained payload dictionary (dictionaries.py)
    T <name>                            -> a claim one instance of a shared index holds
                                           until it expires (Redis only; backend.claim)

The kinds ``b``, ``d``, ``k``, ``v`` and ``x`` belong to a document, and live in the epoch
the document was decided in (:data:`SCOPED`; see :mod:`stream_dedup.index.retention`); the
others are the index's own and live outside every epoch.

Docnums are dense internal numbers in arrival order, so "earliest" is "smallest docnum"
and a bucket stays eight bytes per member.
"""

from __future__ import annotations

from stream_dedup.core.lookup_keys import (
    BUCKET,
    EXACT,
    PACKED_BUCKET_KEY,
    bucket_keys,
    bucket_order,
    bucket_shared,
    exact_key,
    packed_bucket_keys,
    parse_bucket_keys,
)

__all__ = [
    "BUCKET",
    "CLAIM",
    "COUNTER",
    "DICTIONARY",
    "DOC",
    "EPOCHS",
    "EXACT",
    "INTENT",
    "META",
    "OFFSET",
    "PACKED_BUCKET_KEY",
    "POINTS",
    "SCOPED",
    "VERDICT",
    "bucket_keys",
    "bucket_order",
    "bucket_shared",
    "counter_key",
    "dictionary_key",
    "doc_key",
    "exact_key",
    "offset_key",
    "packed_bucket_keys",
    "parse_bucket_keys",
    "parse_offset_key",
    "points_key",
    "verdict_key",
]  # fmt: skip

META = b"M"
COUNTER = b"C"
DOC = b"d"
VERDICT = b"v"
OFFSET = b"o"
INTENT = b"i"
EPOCHS = b"E"
RETENTION = b"R"
POINTS = b"k"
DICTIONARY = b"Z"
CLAIM = b"T"
#: First bytes of the kinds of record that belong to an epoch.
SCOPED = frozenset(b"bdkvx")


def points_key(first_docnum: int) -> bytes:
    return POINTS + first_docnum.to_bytes(8, "big")


def counter_key(name: str) -> bytes:
    return COUNTER + name.encode()


def dictionary_key(ident: int) -> bytes:
    return DICTIONARY + ident.to_bytes(4, "big")


def doc_key(docnum: int) -> bytes:
    return DOC + docnum.to_bytes(8, "big")


def verdict_key(doc_id: str) -> bytes:
    return VERDICT + doc_id.encode("utf-8", "surrogatepass")


def offset_key(topic: str, partition: int) -> bytes:
    return OFFSET + topic.encode() + b"\x00" + partition.to_bytes(4, "big")


def parse_offset_key(key: bytes) -> tuple[str, int]:
    body = key[len(OFFSET) :]
    return body[:-5].decode(), int.from_bytes(body[-4:], "big")
