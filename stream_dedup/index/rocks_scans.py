"""Prefix scans of an epoch's records, spread over its two column families.

An epoch keeps its document records in a family of their own
(:mod:`stream_dedup.index.rocks_families`); every other record is in the epoch's small
family. A scan under a document prefix reads the documents' family, one under any other
prefix the small family, and a scan of everything (the empty prefix) merges the two in
key order, so a caller sees one key space whatever the split.

Errors: a failed read is raised as the package's error (:mod:`.rocks_errors`), and a key
iterator that stops early is told apart from one that reached the end.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from operator import itemgetter

from rocksdict import Rdict, ReadOptions

from stream_dedup.errors import IndexIOError
from stream_dedup.index.keys import DOC
from stream_dedup.index.rocks_errors import failed, from_rocksdb

#: The key of a (key, value) pair, to merge the two families' scans in key order.
_KEY = itemgetter(0)


def upper_bound(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with ``prefix`` (``None``: no bound)."""
    while prefix and prefix[-1] == 0xFF:
        prefix = prefix[:-1]
    return prefix[:-1] + bytes([prefix[-1] + 1]) if prefix else None


def epoch_items(
    path: str, small: Rdict, docs: Rdict, prefix: bytes
) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs under ``prefix`` of the epoch with these families, in key
    order (``path``: the index's, for errors)."""
    if prefix[:1] == DOC:
        return family_items(path, docs, prefix)
    if not prefix and docs is not small:
        return heapq.merge(family_items(path, small, b""), family_items(path, docs, b""), key=_KEY)
    return family_items(path, small, prefix)


def epoch_keys(path: str, small: Rdict, docs: Rdict, prefix: bytes) -> Iterator[bytes]:
    """The keys under ``prefix`` of the epoch with these families, in key order."""
    if prefix[:1] == DOC:
        return family_keys(path, docs, prefix)
    if not prefix and docs is not small:
        return heapq.merge(family_keys(path, small, b""), family_keys(path, docs, b""))
    return family_keys(path, small, prefix)


def family_items(path: str, family: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs under ``prefix`` of one column family, in key order."""
    try:
        it = family.iter()
        it.seek(prefix)
        while it.valid():
            key: bytes = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()
        it.status()  # valid() is False at the end, and also after a failed read
    except Exception as exc:
        if not from_rocksdb(exc):
            raise
        raise failed(path, f"scanning records under prefix {prefix!r}", exc) from exc


def family_keys(path: str, family: Rdict, prefix: bytes) -> Iterator[bytes]:
    """The keys under ``prefix`` of one column family, in key order."""
    # Keys only, iterated on rocksdict's side up to the prefix's end: several times
    # faster than stepping an iterator from Python, which costs a call per key.
    opts = ReadOptions()
    bound = upper_bound(prefix)
    if bound is not None:
        opts.set_iterate_upper_bound(bound)
    key: bytes
    last: bytes | None = None
    try:
        for key in family.keys(from_key=prefix, read_opt=opts):  # type: ignore[assignment]
            if not key.startswith(prefix):
                return
            last = key
            yield key
        # rocksdict's key iterator ends at a failed read as it ends at the last key,
        # which would truncate the scan (a key filter missing keys) without a word.
        # One seek past the last key seen tells the two apart.
        it = family.iter(opts)
        it.seek(prefix if last is None else last + b"\0")  # the first key not seen
        it.status()
        missed: bytes | None = it.key() if it.valid() else None
    except Exception as exc:
        if not from_rocksdb(exc):
            raise
        raise failed(path, f"scanning keys under prefix {prefix!r}", exc) from exc
    if missed is not None and missed.startswith(prefix):
        raise IndexIOError(
            path,
            f"scanning keys under prefix {prefix!r}",
            f"the key iterator ended before {missed!r}, a key it should have returned",
        )
