"""The stream's timeline as stored: the epoch table and clock (key ``E``) and the clock's
change points (``k`` records, one per batch that moved the clock, in its epoch).

Read whole when an index opens; a shared index, which re-reads its state at every lease,
reads only what other instances added since (:func:`refresh_timeline`), so a lease
costs their progress, not the whole window.
"""

from __future__ import annotations

import numpy as np

from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.retention import I64, Timeline, decode_points

__all__ = ["load_timeline", "refresh_timeline", "stored_epochs"]

#: Documents decided by other instances since a shared index's last lease above which
#: the change points are read again whole rather than key by key.
POINTS_READ_MAX = 200_000


def stored_epochs(raw: bytes) -> Timeline:
    """The epochs and clock stored as ``raw`` (the ``E`` key), without change points."""
    return Timeline.from_bytes(raw, np.empty(0, np.int64), np.empty(0, np.int64))


def load_timeline(backend: Backend, raw: bytes) -> Timeline:
    """The timeline stored as ``raw``, with every change point of its live epochs."""
    body = stored_epochs(raw)
    present = set(backend.epochs())
    records: list[bytes] = []
    for epoch in body.numbers():
        if epoch in present:
            records.extend(v for _, v in backend.scan_prefix(keys.POINTS, epoch))
    points_doc, points_clock = decode_points(records)
    return Timeline(body.epochs, body.clock, points_doc, points_clock)


def refresh_timeline(
    backend: Backend, raw: bytes, known: Timeline, since: int, until: int
) -> Timeline:
    """The timeline stored as ``raw``, given ``known``, whose change points are those of
    the documents before docnum ``since``: theirs that are still live, and those read of
    the documents from ``since`` to ``until`` (the next docnum now)."""
    if until - since > POINTS_READ_MAX:
        return load_timeline(backend, raw)
    body = stored_epochs(raw)
    keep = known.points_doc >= body.live_first
    new_doc, new_clock = _points_between(backend, body, since, until)
    return Timeline(
        body.epochs,
        body.clock,
        np.concatenate([known.points_doc[keep], new_doc]),
        np.concatenate([known.points_clock[keep], new_clock]),
    )


def _points_between(backend: Backend, body: Timeline, start: int, end: int) -> tuple[I64, I64]:
    """The change points of the batches that began at docnums ``start`` to ``end``: a
    batch's record is keyed by its first docnum and lives in the epoch holding it, so
    every docnum of the range is a key to try (one batched read per epoch)."""
    if end <= start:
        return decode_points([])
    firsts = np.array([e.first for e in body.epochs], dtype=np.int64)
    docnums = np.arange(start, end, dtype=np.int64)
    where = np.searchsorted(firsts, docnums, side="right") - 1
    records: list[bytes] = []
    for i, epoch in enumerate(body.epochs):
        nums = docnums[where == i].tolist()
        if nums:
            found = backend.get_many([keys.points_key(n) for n in nums], epoch.number)
            records.extend(v for v in found if v is not None)
    return decode_points(records)
