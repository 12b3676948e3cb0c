"""The bytes between the check process's front and its readers: a check's reads out, what
the index holds for it back, and the few other messages of :mod:`.check_reader`.

Why not pickles: a request is a handful of arrays and keys, a reply a handful of records,
sent 200 times a second each way. Through :mod:`multiprocessing`'s pickler (a new pickler
per message, each array rebuilt through its reduce function) a round trip with real reads
and replies cost ~82-88 µs of CPU on each side, raw ~60-67 µs, the wake-up included
(``bench/bench_check_wire.py``, 2026-11-26). So each message is one ``send_bytes``: a kind
byte, then fixed-width counts (``struct``), then the arrays' raw bytes, then the
variable-length keys or strings joined, their lengths in an array before them.

Layouts (little-endian, native array byte order; both ends are one machine):

- read (``b"r"``): counts ``<7q`` (live texts, cap, exact keys, bucket keys, set values,
  set offsets, set lengths); then the bucket fingerprints (u64), set offsets and lengths
  (i64), set values (u32), the exact keys' and bucket keys' lengths (u32); then the keys
  joined.
- held (``b"h"``): counts ``<3q`` (texts, candidates in all, records); candidates per
  text (i64), the candidates (i64), the records' docnums (i64), the lengths of each
  record's id, cluster id and payload (u32, three per record), their text flags (u8);
  then per record its id, cluster id (UTF-8, surrogates passed, as the index stores them)
  and payload joined.
- dictionary (``b"d"`` and ``<q`` its id) -> ``b"d"`` and ``b"\\x00"`` (not stored) or
  ``b"\\x01"`` and the dictionary's bytes.
- follow (``b"f"``) -> ``b"f"`` and ``<dq`` (its seconds, the documents it sees).
- failed (``b"x"``) and the reason, UTF-8: the reader could not read the index.

Arrays are copied out of the message on decoding (microseconds): the compiled kernels
take writable, aligned arrays, and a view would keep the whole message alive.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from stream_dedup.dedup.check import CheckReads, Held
from stream_dedup.index.store import DocRecord

__all__ = [
    "DICTIONARY",
    "FAILED",
    "FOLLOW",
    "HELD",
    "READ",
    "decode_dictionary",
    "decode_followed",
    "decode_held",
    "decode_reads",
    "dictionary_request",
    "encode_dictionary",
    "encode_followed",
    "encode_held",
    "encode_reads",
    "requested_dictionary",
]

#: The kind byte that starts each message.
READ, HELD, DICTIONARY, FOLLOW, FAILED = b"r", b"h", b"d", b"f", b"x"

_READ_COUNTS = struct.Struct("<7q")
_HELD_COUNTS = struct.Struct("<3q")
_FOLLOWED = struct.Struct("<dq")
_IDENT = struct.Struct("<q")
_SURROGATES = "surrogatepass"

_T = TypeVar("_T", bound=np.generic)


class _Cursor:
    """Reads consecutive arrays and byte strings out of one message."""

    def __init__(self, message: bytes, at: int) -> None:
        self.view = memoryview(message)
        self.at = at

    def array(self, dtype: type[_T], count: int) -> npt.NDArray[_T]:
        out: npt.NDArray[_T] = np.frombuffer(
            self.view, dtype=dtype, count=count, offset=self.at
        ).copy()
        self.at += out.nbytes
        return out

    def chunks(self, lengths: Sequence[int]) -> list[bytes]:
        out: list[bytes] = []
        at, view = self.at, self.view
        for n in lengths:
            out.append(bytes(view[at : at + n]))
            at += n
        self.at = at
        return out


def _lengths(items: Sequence[bytes]) -> bytes:
    return np.fromiter(map(len, items), dtype=np.uint32, count=len(items)).tobytes()


def encode_reads(reads: CheckReads) -> bytes:
    """A check's reads as one read request (see the module docstring)."""
    counts = _READ_COUNTS.pack(
        reads.n_live, reads.cap, len(reads.exact_keys), len(reads.bucket_keys),
        reads.set_flat.size, reads.set_at.size, reads.set_len.size,
    )  # fmt: skip
    return b"".join(
        (
            READ,
            counts,
            np.ascontiguousarray(reads.bucket_fingerprints, dtype=np.uint64).tobytes(),
            np.ascontiguousarray(reads.set_at, dtype=np.int64).tobytes(),
            np.ascontiguousarray(reads.set_len, dtype=np.int64).tobytes(),
            np.ascontiguousarray(reads.set_flat, dtype=np.uint32).tobytes(),
            _lengths(reads.exact_keys),
            _lengths(reads.bucket_keys),
            *reads.exact_keys,
            *reads.bucket_keys,
        )
    )


def decode_reads(message: bytes) -> CheckReads:
    """The :class:`CheckReads` of a read request (its kind byte included)."""
    n_live, cap, n_exact, n_bucket, n_flat, n_at, n_len = _READ_COUNTS.unpack_from(message, 1)
    cur = _Cursor(message, 1 + _READ_COUNTS.size)
    fingerprints = cur.array(np.uint64, n_bucket)
    set_at, set_len = cur.array(np.int64, n_at), cur.array(np.int64, n_len)
    set_flat = cur.array(np.uint32, n_flat)
    exact_lengths = cur.array(np.uint32, n_exact).tolist()
    bucket_lengths = cur.array(np.uint32, n_bucket).tolist()
    exact_keys, bucket_keys = cur.chunks(exact_lengths), cur.chunks(bucket_lengths)
    return CheckReads(n_live, exact_keys, bucket_keys, fingerprints, set_flat, set_at, set_len, cap)


def encode_held(held: Held) -> bytes:
    """What the index holds for a check as one reply (see the module docstring)."""
    docnums = list(held.records)
    records = [held.records[d] for d in docnums]
    ids = [r.doc_id.encode("utf-8", _SURROGATES) for r in records]
    clusters = [r.cluster_id.encode("utf-8", _SURROGATES) for r in records]
    lengths = np.empty((len(records), 3), dtype=np.uint32)
    for i, (doc_id, cluster, rec) in enumerate(zip(ids, clusters, records, strict=True)):
        lengths[i] = (len(doc_id), len(cluster), len(rec.payload))
    flat = [d for ranked in held.candidates for d in ranked]
    blob: list[bytes] = []
    for doc_id, cluster, rec in zip(ids, clusters, records, strict=True):
        blob += (doc_id, cluster, rec.payload)
    return b"".join(
        (
            HELD,
            _HELD_COUNTS.pack(len(held.candidates), len(flat), len(records)),
            np.fromiter(map(len, held.candidates), dtype=np.int64).tobytes(),
            np.asarray(flat, dtype=np.int64).tobytes(),
            np.asarray(docnums, dtype=np.int64).tobytes(),
            lengths.tobytes(),
            bytes(r.text for r in records),
            *blob,
        )
    )


def decode_held(message: bytes) -> Held:
    """The :class:`Held` of a held reply (its kind byte included)."""
    n_texts, n_flat, n_records = _HELD_COUNTS.unpack_from(message, 1)
    cur = _Cursor(message, 1 + _HELD_COUNTS.size)
    per_text = cur.array(np.int64, n_texts).tolist()
    flat = cur.array(np.int64, n_flat).tolist()
    docnums = cur.array(np.int64, n_records).tolist()
    lengths = cur.array(np.uint32, 3 * n_records).tolist()
    texts = cur.array(np.uint8, n_records).tolist()
    parts = cur.chunks(lengths)
    candidates: list[list[int]] = []
    at = 0
    for n in per_text:
        candidates.append(flat[at : at + n])
        at += n
    records = {
        d: DocRecord(
            parts[3 * i].decode("utf-8", _SURROGATES),
            parts[3 * i + 1].decode("utf-8", _SURROGATES),
            parts[3 * i + 2],
            bool(texts[i]),
        )
        for i, d in enumerate(docnums)
    }
    return Held(candidates, records)


def encode_dictionary(raw: bytes | None) -> bytes:
    """A dictionary reply: the stored bytes, or that none is stored."""
    return DICTIONARY + (b"\x00" if raw is None else b"\x01" + raw)


def decode_dictionary(message: bytes) -> bytes | None:
    return None if message[1:2] == b"\x00" else message[2:]


def encode_followed(seconds: float, documents: int) -> bytes:
    """A follow's reply: how long the catch-up took, and the documents now seen."""
    return FOLLOW + _FOLLOWED.pack(seconds, documents)


def decode_followed(message: bytes) -> tuple[float, int]:
    seconds, documents = _FOLLOWED.unpack_from(message, 1)
    return float(seconds), int(documents)


def dictionary_request(ident: int) -> bytes:
    """A request for the stored payload dictionary ``ident``."""
    return DICTIONARY + _IDENT.pack(ident)


def requested_dictionary(message: bytes) -> int:
    return int(_IDENT.unpack_from(message, 1)[0])
