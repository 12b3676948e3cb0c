"""Documents without a time of their own: counted, and warned about at most once a minute.

The service takes a document's time from ``input.time_field`` or, when that field is
missing or unreadable (or none is named), from the message timestamp; a document with
neither is decided at the stream's clock as it stands. Either is right for a stray
record, and a sign of misconfiguration when it holds for a whole batch: a field name that
no record has (documents then measured on the producer's timestamps, which may be far
from the documents' own time), or a retention window over messages that carry no
timestamp (the window has nothing to measure, and while the clock is unset it expires
nothing). So every batch adds to two counters, and a batch where all documents are in
one of those cases logs a warning, at most one a minute, saying how many batches were
not logged since the last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from stream_dedup.dedup import BatchStats
from stream_dedup.logs import fields
from stream_dedup.service.metrics import Metrics

log = logging.getLogger("stream_dedup.service")

#: Seconds between two warnings (the counters count every document).
WARN_EVERY_S = 60.0


class TimeWarnings:
    """Counts a committed batch's documents without a time of their own; warns, bounded."""

    def __init__(
        self,
        time_field: str,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = WARN_EVERY_S,
    ) -> None:
        self.time_field = time_field
        self._metrics = metrics
        self._clock = clock
        self._every_s = every_s
        self._last: float | None = None
        self._unlogged = 0

    def observe(self, documents: int, field_missing: int, stats: BatchStats) -> None:
        """A batch of ``documents`` decided: ``field_missing`` of them had no readable
        ``input.time_field``; ``stats`` says how many had no time at all."""
        self._metrics.time_field_missing.inc(field_missing)
        self._metrics.untimed.inc(stats.untimed)
        if stats.window_without_time:
            message = (
                "retention window in force, but no document of the batch had a time (no "
                "message timestamp, no readable input.time_field): the window cannot "
                "measure them, and while the stream's clock is unset it expires nothing"
            )
            action = (
                "set input.time_field to a field holding the documents' time, have the "
                'producers set message timestamps, or set index.retention = "none"'
            )
        elif documents and field_missing == documents:
            message = (
                f"input.time_field {self.time_field!r} missing or unreadable in every "
                "document of the batch: their time is the message timestamp"
            )
            action = (
                "check input.time_field: it must name a field of the records holding epoch "
                "milliseconds or ISO-8601 (leave it empty to use message timestamps)"
            )
        else:
            return
        now = self._clock()
        if self._last is not None and now - self._last < self._every_s:
            self._unlogged += 1
            return
        log.warning(
            message,
            extra=fields(
                documents=documents,
                field_missing=field_missing,
                untimed=stats.untimed,
                batches_not_logged=self._unlogged,
                action=action,
            ),
        )
        self._last = now
        self._unlogged = 0
