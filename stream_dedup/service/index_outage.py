"""Riding out a shared index's Redis outage: back off and retry, up to a limit.

A Redis restart or failover takes seconds; stopping the service for it (exit code 3)
turns a blip into a restart of every instance of the group. :class:`IndexOutage` runs one
step of the commit protocol again while its failure is
:class:`~stream_dedup.errors.IndexUnreachableError`, the way librdkafka waits out a
broker: the first failure is one warning, a summary follows each ``summary_s`` while the
outage lasts, and one line says when Redis answers again. Readiness is false meanwhile
(:attr:`IndexOutage.down_since`), and the metrics show it (``stream_dedup_index_up``,
``stream_dedup_index_retries_total``). Past ``index.redis.outage_limit_s`` the error is
raised, naming the limit, and the service stops as before.

Retrying a step is safe because every step the strategy retries is whole and idempotent
on the index (``docs/shared-index.md``, "A Redis outage"): deciding and storing a batch
takes the lease again, which first finishes a write the outage left half done, then
finds the documents already stored by id; storing offsets writes the same values again.
Other index errors (a lost lease, stored bytes that do not parse) are not outages and are
raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from stream_dedup.errors import IndexUnreachableError
from stream_dedup.logs import fields
from stream_dedup.service.metrics import Metrics

log = logging.getLogger("stream_dedup.service.index")

T = TypeVar("T")

#: Longest single sleep: the health probe is fed between sleeps (``keep_waiting``).
_SLICE_S = 0.5


class IndexOutage:
    """Runs index steps through Redis outages shorter than ``limit_s`` (0: none).

    ``keep_waiting`` is asked between attempts (it also feeds the health probe): False
    gives up at once, as when the service is stopping. ``backoff`` is (first, longest)
    seconds between attempts, doubling.
    """

    def __init__(
        self,
        limit_s: float,
        metrics: Metrics,
        keep_waiting: Callable[[], bool],
        backoff: tuple[float, float] = (0.1, 2.0),
        summary_s: float = 60.0,
    ) -> None:
        self._limit_s = limit_s
        self._metrics = metrics
        self._keep_waiting = keep_waiting
        self._backoff = backoff
        self._summary_s = summary_s
        #: When the current outage began (monotonic clock), or None while Redis answers.
        self.down_since: float | None = None
        self._last_line_at = 0.0
        self._retries = 0
        self._suppressed = 0
        metrics.index_up.set(1)

    def call(self, operation: str, step: Callable[[], T]) -> T:
        """``step()``, again after each :class:`IndexUnreachableError` until the outage
        has lasted ``limit_s``; then that error, saying so."""
        delay = self._backoff[0]
        while True:
            try:
                result = step()
            except IndexUnreachableError as exc:
                self._failed(operation, exc)
                self._sleep(delay)
                delay = min(2 * delay, self._backoff[1])
                continue
            self._reachable()
            return result

    def _failed(self, operation: str, exc: IndexUnreachableError) -> None:
        """Count and tell a failed attempt; raise when the limit is reached or a stop came."""
        now = time.monotonic()
        if self.down_since is None:
            self.down_since, self._last_line_at = now, now
            self._retries, self._suppressed = 0, 0
            self._metrics.index_up.set(0)
            log.warning(
                "shared index unreachable; retrying",
                extra=fields(
                    operation=operation,
                    error=exc.detail,
                    limit_s=self._limit_s,
                    action="check Redis (index.redis.url); the service waits for it up to "
                    "index.redis.outage_limit_s, not ready meanwhile",
                ),
            )
        elif now - self._last_line_at >= self._summary_s:
            log.warning(
                "shared index still unreachable",
                extra=fields(
                    operation=operation,
                    down_s=round(now - self.down_since, 1),
                    retries=self._retries,
                    errors_suppressed=self._suppressed,
                    error=exc.detail,
                ),
            )
            self._last_line_at, self._suppressed = now, 0
        else:
            self._suppressed += 1
        down_s = now - self.down_since
        if down_s >= self._limit_s:
            self._give_up(exc, down_s)
        if not self._keep_waiting():
            raise exc
        self._retries += 1
        self._metrics.index_retries.inc()

    def _give_up(self, exc: IndexUnreachableError, down_s: float) -> None:
        log.error(
            "shared index unreachable for longer than index.redis.outage_limit_s; stopping",
            extra=fields(down_s=round(down_s, 1), limit_s=self._limit_s, retries=self._retries),
        )
        raise IndexUnreachableError(
            exc.path,
            exc.operation,
            f"{exc.detail}; unreachable for {down_s:.1f} s, over index.redis.outage_limit_s "
            f"= {self._limit_s:g} s",
        ) from exc

    def _sleep(self, delay_s: float) -> None:
        """Sleep ``delay_s`` in slices, asking ``keep_waiting`` (the health beat) between."""
        until = time.monotonic() + delay_s
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, _SLICE_S))
            if not self._keep_waiting():
                return

    def _reachable(self) -> None:
        if self.down_since is None:
            return
        down_s = round(time.monotonic() - self.down_since, 1)
        self.down_since = None
        self._metrics.index_up.set(1)
        log.info(
            "shared index reachable again",
            extra=fields(down_s=down_s, retries=self._retries, errors_suppressed=self._suppressed),
        )
