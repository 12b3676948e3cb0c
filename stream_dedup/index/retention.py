"""Retention: which documents the index still holds, and the epochs that let the rest go.

**What is held.** A document is held while it is at most ``window`` older than the
stream's clock, and while it is among the newest ``max_documents`` indexed. The stream's
clock is the latest document time decided so far (the service's message timestamp or
``input.time_field``; offline, ``--time-field``), in whole seconds; a document's own age
is measured by the clock *when it was decided* (for a document on time, its own time; a
late one is held a full window from when it arrived). Both rules keep a suffix of the
docnums, which are given in decision order: everything below one *cutoff* docnum has
expired, for good, since the clock and the docnums only move forward. The matching pass
(:mod:`stream_dedup.core.match`) applies the cutoff document by document, so a copy
arriving inside the window is a duplicate and one arriving after it is unique, exactly.

The clock per docnum is kept as *change points* (the first docnum decided at each newer
clock second: at most one per second of stream time, never one per document), so the
cutoff for a time is one binary search.

**Epochs.** Reclaiming expired documents key by key would cost a delete per key (~20 per
document) and a compaction to make them count. Instead every record that belongs to a
document (its band buckets, exact-text and verdict keys, document record, change points)
is written to the *epoch* open when it was decided, and a new epoch opens when the
current one holds a slice (1/:data:`SLICES`) of the window. An epoch whose every document
has expired is dropped whole: for RocksDB, its two column families, files deleted at once.
Lookups read every live epoch (each has its own key filter, so a miss costs one filter
probe per epoch), and the old epochs, never written again, are never compacted again:
the cost of a document stays that of a window's worth of index, however long the stream.
The index holds at most the window plus one slice.

Epoch 0 is the index without retention: its records live in the layout of indexes built
before retention existed, so those open unchanged; switching retention on starts epoch 1,
and epoch 0 goes as a whole once its documents have expired (by range deletes: its
records share the default column family with the index's own keys).

The epochs and the clock are one small record (``E``) written with every batch; the change
points of a batch are a record (``k``) in its epoch. All of it changes only in a batch's
atomic commit, so a replay after a crash sees the same epochs, clock and cutoff, and
decides the same.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream_dedup.core.match import NO_CLOCK
from stream_dedup.errors import ConfigError, IndexCorruptError

__all__ = [
    "NO_CLOCK", "NO_RETENTION", "SLICES", "Epoch", "Retention", "RetentionChange", "Timeline",
    "decode_points", "encode_points", "first_held", "format_duration", "parse_duration",
]  # fmt: skip

#: Epochs per window: an epoch is dropped once all of it has expired, so the index holds up
#: to one slice more than the window; more slices mean more key-filter probes per lookup.
SLICES = 8

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")

I64 = npt.NDArray[np.int64]


def parse_duration(value: str | int | None, key: str = "index.retention") -> int:
    """Seconds in a duration: ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"`` or a number of
    seconds; ``""``, ``"none"``, ``"off"`` or ``None`` mean no window (0).

    A zero duration (``"0"``, ``"0d"``, ``0``) is a :class:`ConfigError`, not "no window":
    read literally it would expire every document at once, and read as "none" it would
    silently keep everything, so the error says which to write instead.
    """
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration such as '30d', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, f"must not be negative, got {value}")
        if value == 0:
            raise _zero(key, value)
        return value
    text = str(value).strip().lower()
    if text in ("", "none", "off"):
        return 0
    found = _DURATION.match(text)
    if found is None:
        raise ConfigError(
            key,
            f"{value!r} is not a duration: write a number and a unit, s, m, h, d or w "
            "(e.g. '30d', '12h'), or 'none'",
        )
    seconds = int(found.group(1)) * _UNITS[found.group(2) or "s"]
    if seconds == 0:
        raise _zero(key, value)
    return seconds


def _zero(key: str, value: str | int) -> ConfigError:
    """The error for a zero duration: what to write for no retention, or for a window."""
    return ConfigError(
        key,
        f"{value!r} is a window of zero, which would hold nothing: for no time window "
        "write 'none' (or leave the option out: a new index then has none), "
        "else give a duration such as '30d' or '12h'",
    )


def format_duration(seconds: int) -> str:
    """``seconds`` in the largest unit that divides it (``2592000`` -> ``"30d"``)."""
    if seconds <= 0:
        return "none"
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of the stream the index holds: ``window`` seconds of the stream's clock
    and at most ``max_documents`` documents (0: no limit of that kind)."""

    window: int = 0
    max_documents: int = 0

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ConfigError("index.retention", f"must not be negative, got {self.window}")
        if self.max_documents < 0:
            raise ConfigError(
                "index.max_documents", f"must not be negative, got {self.max_documents}"
            )

    @property
    def enabled(self) -> bool:
        return self.window > 0 or self.max_documents > 0

    def epoch_full(self, documents: int, span: int) -> bool:
        """Whether an epoch holding ``documents`` over ``span`` seconds of clock is a slice."""
        if self.max_documents and documents >= math.ceil(self.max_documents / SLICES):
            return True
        return bool(self.window) and span >= max(1, self.window // SLICES)

    def to_bytes(self) -> bytes:
        return json.dumps({"window": self.window, "max_documents": self.max_documents}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Retention:
        try:
            body = json.loads(raw)
            return cls(int(body["window"]), int(body["max_documents"]))
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise IndexCorruptError(f"the index's retention record does not parse: {exc}") from exc

    def describe(self) -> str:
        parts = []
        if self.window:
            parts.append(f"window {format_duration(self.window)}")
        if self.max_documents:
            parts.append(f"at most {self.max_documents:,} documents")
        return ", ".join(parts) or "none (the index keeps every document)"


NO_RETENTION = Retention()


@dataclass(frozen=True, slots=True)
class RetentionChange:
    """Retention options given over what an index stores: each ``None`` keeps the stored
    value. How the command line and the Python API say what they want when they open an
    index (:func:`~stream_dedup.index.opener.open_index`), before the stored retention is
    known; the index applies it once, at opening (:meth:`applied_to`)."""

    window: int | None = None
    max_documents: int | None = None

    @classmethod
    def of(
        cls, window: str | int | None, max_documents: int | None, key: str = "retention"
    ) -> RetentionChange:
        """The change a duration (:func:`parse_duration`) and a count ask for, checked now,
        so that a bad option fails before any index is opened; ``key`` names the option
        in errors."""
        seconds = None if window is None else parse_duration(window, key)
        if max_documents is not None:
            Retention(0, max_documents)  # a negative count fails as it would in force
        return cls(seconds, max_documents)

    def applied_to(self, stored: Retention) -> Retention:
        """The retention in force once this change is made over ``stored``."""
        return Retention(
            stored.window if self.window is None else self.window,
            stored.max_documents if self.max_documents is None else self.max_documents,
        )


def first_held(
    points_doc: I64, points_clock: I64, clock: int, next_docnum: int, retention: Retention
) -> int:
    """The cutoff: the first docnum still held at ``clock`` once ``next_docnum`` is next.

    ``points_*`` are the change points (ascending): docnums from ``points_doc[j]`` on were
    decided at clock ``points_clock[j]``; docnums before the first point count as decided
    at its clock. The same rule as the matching pass applies per document.
    """
    lo = 0
    if retention.window and clock != NO_CLOCK and points_clock.size:
        j = int(np.searchsorted(points_clock, clock - retention.window, side="left"))
        if j == points_clock.size:
            lo = next_docnum
        elif j > 0:
            lo = int(points_doc[j])
    if retention.max_documents:
        lo = max(lo, next_docnum - retention.max_documents)
    return max(0, min(lo, next_docnum))


@dataclass(frozen=True, slots=True)
class Epoch:
    """One slice of the index: its number, its first docnum, the clock when it opened."""

    number: int
    first: int
    opened: int


@dataclass(frozen=True, slots=True)
class Timeline:
    """The live epochs (oldest first), the stream's clock, and the change points of the
    live epochs. Immutable: a batch's commit builds the next one (:meth:`after`)."""

    epochs: tuple[Epoch, ...]
    clock: int
    points_doc: I64
    points_clock: I64

    @classmethod
    def fresh(cls) -> Timeline:
        """An index without retention history: epoch 0 from docnum 0, no clock."""
        empty = np.empty(0, dtype=np.int64)
        return cls((Epoch(0, 0, NO_CLOCK),), NO_CLOCK, empty, empty)

    @property
    def current(self) -> Epoch:
        return self.epochs[-1]

    @property
    def live_first(self) -> int:
        """The first docnum of the oldest live epoch: nothing before it is stored."""
        return self.epochs[0].first

    def numbers(self) -> list[int]:
        return [e.number for e in self.epochs]

    def batch_epoch(self, retention: Retention, next_docnum: int) -> int:
        """The epoch the next batch writes to: the current one, or a new one when it is
        full (or is epoch 0 and retention is on). Decided from committed state only, so a
        replayed batch writes where the first attempt did."""
        cur = self.current
        if not retention.enabled:
            return cur.number
        if cur.number == 0:
            return 1
        span = 0 if NO_CLOCK in (cur.opened, self.clock) else self.clock - cur.opened
        return cur.number + 1 if retention.epoch_full(next_docnum - cur.first, span) else cur.number

    def cutoff(self, retention: Retention, next_docnum: int) -> int:
        """The first docnum held now (never before the oldest live epoch)."""
        lo = first_held(self.points_doc, self.points_clock, self.clock, next_docnum, retention)
        return max(lo, self.live_first) if next_docnum > self.live_first else next_docnum

    def clock_at(self, docnum: int) -> int:
        """The clock ``docnum`` was decided at (:data:`NO_CLOCK` if none was known)."""
        if not self.points_doc.size:
            return NO_CLOCK
        at = max(0, int(np.searchsorted(self.points_doc, docnum, side="right")) - 1)
        return int(self.points_clock[at])

    def after(
        self,
        epoch: int,
        next_before: int,
        new_doc: I64,
        new_clock: I64,
        clock: int,
        next_docnum: int,
        retention: Retention,
    ) -> tuple[Timeline, list[int]]:
        """The timeline once a batch is committed, and the epochs it lets go.

        The batch wrote to ``epoch`` (opened now if it is new, at docnum ``next_before``),
        added the change points ``new_*``, moved the clock to ``clock`` and the next
        docnum to ``next_docnum``. An epoch other than the batch's is let go when every
        document in it is below the cutoff. The change points kept are the live epochs'
        own, as reopening the index would load them.
        """
        epochs = list(self.epochs)
        if epoch != epochs[-1].number:
            epochs.append(Epoch(epoch, next_before, clock))
        elif epochs[-1].opened == NO_CLOCK and clock != NO_CLOCK and epoch != 0:
            epochs[-1] = Epoch(epoch, epochs[-1].first, clock)
        points_doc = np.concatenate([self.points_doc, new_doc])
        points_clock = np.concatenate([self.points_clock, new_clock])
        lo = first_held(points_doc, points_clock, clock, next_docnum, retention)
        dead: list[int] = []
        while len(epochs) > 1 and epochs[1].first <= lo:
            dead.append(epochs.pop(0).number)
        if dead:
            keep = points_doc >= epochs[0].first
            points_doc, points_clock = points_doc[keep], points_clock[keep]
        return Timeline(tuple(epochs), clock, points_doc, points_clock), dead

    def to_bytes(self) -> bytes:
        body = {"epochs": [[e.number, e.first, e.opened] for e in self.epochs], "clock": self.clock}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, points_doc: I64, points_clock: I64) -> Timeline:
        try:
            body = json.loads(raw)
            epochs = tuple(Epoch(int(n), int(f), int(o)) for n, f, o in body["epochs"])
            clock = int(body["clock"])
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexCorruptError(f"the index's epoch table does not parse: {exc}") from exc
        if not epochs:
            raise IndexCorruptError("the index's epoch table lists no epoch")
        return cls(epochs, clock, points_doc, points_clock)


def encode_points(docs: I64, clocks: I64) -> bytes:
    """A batch's change points as stored: (docnum, clock) pairs of int64 LE."""
    return np.stack([docs, clocks], axis=1).astype("<i8").tobytes()


def decode_points(raws: list[bytes]) -> tuple[I64, I64]:
    """Change points from their stored records, in the order given (ascending)."""
    if not raws:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy()
    pairs = np.frombuffer(b"".join(raws), dtype="<i8").reshape(-1, 2).astype(np.int64)
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])
