"""A stop requested by SIGTERM or SIGINT (or by code): asked once, honoured at the next safe point.

``stream-dedup run`` installs the handlers before anything else (reading the settings,
opening the index, building the key filter, compiling the kernels), so a signal in those
seconds is never lost: a process started as a background job of a script inherits SIGINT
*ignored*, and Python installs no handler of its own over that. A handler only records
the request; the service checks it between batches, and while it starts up (the key filter
is built in steps that each look at it), then finishes its batch, checkpoints and leaves the
group. A watchdog, armed by the signal, bounds the whole stop by ``service.shutdown_timeout_s``:
past it the process exits without the final checkpoint (the last batch is replayed at the
next start).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

from stream_dedup.errors import StreamDedupError
from stream_dedup.logs import fields

log = logging.getLogger("stream_dedup.service")


class StartInterruptedError(StreamDedupError):
    """A stop was requested while the service started: the start ends before any Kafka
    client is created, and the run returns 0 (caught by the service, never raised out)."""


class StopRequest:
    """Whether, and since when, a stop was asked for."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._requested_at: float | None = None
        #: Seconds a signalled stop may take before the watchdog exits hard; None: no limit
        #: known yet (the settings are not read): the watchdog is armed once it is.
        self._timeout_s: float | None = None
        self._watchdog: threading.Timer | None = None
        self._signalled = False

    @property
    def event(self) -> threading.Event:
        """Set once a stop is requested (what loops wait on)."""
        return self._event

    def is_set(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        """Ask for a stop (thread- and signal-safe; the first request's time counts)."""
        if self._requested_at is None:
            self._requested_at = time.monotonic()
        self._event.set()

    def waited_s(self) -> float | None:
        """Seconds since the stop was requested, or None while none is."""
        if self._requested_at is None:
            return None
        return time.monotonic() - self._requested_at

    def install(self) -> None:
        """SIGTERM and SIGINT request a stop (call from the main thread, first thing)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("stop requested", extra=fields(signal=signal.Signals(signum).name))
            self._signalled = True
            self.request()
            self._arm_watchdog()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def bound(self, timeout_s: float) -> None:
        """A signalled stop must end within ``timeout_s`` seconds of its request."""
        self._timeout_s = timeout_s
        if self._signalled:
            self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        """Bound the stop: if it takes longer than the timeout, exit hard."""
        timeout_s = self._timeout_s
        if timeout_s is None or self._watchdog is not None:
            return

        def expire() -> None:
            log.error(
                "graceful stop overran its time; exiting without a final checkpoint",
                extra=fields(
                    timeout_s=timeout_s,
                    action="none: the last batch is replayed at the next start",
                ),
            )
            os._exit(1)

        left = max(0.0, timeout_s - (self.waited_s() or 0.0))
        self._watchdog = threading.Timer(left, expire)
        self._watchdog.daemon = True
        self._watchdog.start()
