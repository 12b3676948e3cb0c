"""Broker outages and librdkafka's own log lines, told once instead of once per retry.

librdkafka connects in the background and reconnects on its own with backoff, reporting
every failed attempt. :class:`BrokerWatch` turns the clients' errors into one warning, a
summary a minute while an outage lasts and a line when it ends; :class:`LibrdkafkaLog`
keeps librdkafka's log lines from flooding. Both log under ``stream_dedup.service.kafka``
with the rest of the Kafka edge, so one logger setting covers it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError

from stream_dedup.logs import LogThrottle, fields

log = logging.getLogger("stream_dedup.service.kafka")


_NUMBERS = re.compile(r"\d+")

#: librdkafka log facilities whose lines also reach ``error_cb`` (see :class:`LibrdkafkaLog`).
_ALSO_ERRORS = frozenset({"FAIL", "ERROR"})


class LibrdkafkaLog:
    """librdkafka's own log lines into a Python logger (the ``logger`` client setting).

    confluent_kafka calls ``log(level, "%s [%s] %s", facility, client, text)``. Lines that
    differ only in numbers (ports, milliseconds, counts) are one kind: the first is
    logged, then at most one per ``window_s`` carrying the count of those left out. A
    broker that is down makes a ``FAIL`` line at every reconnect attempt; such lines (and
    ``ERROR`` ones) are logged at debug level, because each is also an error for
    ``error_cb``, which :class:`BrokerWatch` turns into one warning and a summary a minute.
    """

    def __init__(self, logger: logging.Logger, window_s: float = 60.0) -> None:
        self.logger = logger
        self._throttle = LogThrottle(window_s)

    def log(self, level: int, fmt: str, *args: object) -> None:
        try:
            text = fmt % args
        except TypeError:
            text = " ".join(map(str, (fmt, *args)))
        facility = str(args[0]) if args else ""
        if facility in _ALSO_ERRORS:
            level = logging.DEBUG
        if not self.logger.isEnabledFor(level):
            return
        dropped = self._throttle.admit((facility, _NUMBERS.sub("#", text)))
        if dropped is None:
            return
        self.logger.log(level, text, extra=fields(suppressed=dropped) if dropped else None)


#: Errors that mean a client cannot reach the brokers: refused, unresolvable, no answer.
_UNREACHABLE = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT,
    }
)


class _Outage:
    """Whether the brokers at one bootstrap address are reachable, shared by the clients
    of a process that use them: one outage is one story in the log, not one per client."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.last_error_at = 0.0
        self.last_line_at = 0.0
        self.suppressed = 0
        self.clients: set[str] = set()


#: The outages of the bootstrap addresses in use (forgotten with their last watch).
_OUTAGES: weakref.WeakValueDictionary[str, _Outage] = weakref.WeakValueDictionary()
_OUTAGES_LOCK = threading.Lock()


def _outage_of(bootstrap: str) -> _Outage:
    with _OUTAGES_LOCK:
        outage = _OUTAGES.get(bootstrap)
        if outage is None:
            outage = _Outage(bootstrap)
            _OUTAGES[bootstrap] = outage
        return outage


class BrokerWatch:
    """librdkafka ``error_cb``: an outage is logged once, summarized, and closed.

    librdkafka keeps reconnecting by itself (``reconnect.backoff.ms`` up to
    ``reconnect.backoff.max.ms``) and reports every failed attempt; the loop just keeps
    polling. The first error of an outage is a warning that says what to check; while it
    lasts, at most one summary per ``summary_s`` says for how long and how many errors
    were left out; a line says when the brokers answer again (:meth:`alive`, or a
    connected broker in the client's statistics), once no error came for ``quiet_s`` (so
    a broker that stays down among others that answer does not open and close an outage
    at every attempt). The consumer and the producer of a process share one outage per
    bootstrap address (:meth:`bind`). Other errors are logged once per kind a minute. A
    fatal error is remembered for the loop to raise: nothing can recover it in-process.
    """

    def __init__(self, client: str, summary_s: float = 60.0, quiet_s: float = 5.0) -> None:
        self.client = client
        self.fatal: KafkaError | None = None
        self._summary_s = summary_s
        self._quiet_s = quiet_s
        self._outage = _Outage("")  # this client's own until bind()
        self._errors = LogThrottle(summary_s)

    def bind(self, conf: Mapping[str, Any]) -> None:
        """Share the outage of ``conf``'s bootstrap address with the process's other clients.

        Errors come about once per ``reconnect.backoff.ms`` while a broker is down, so an
        outage is over only after three of those without one (``quiet_s`` at least).
        """
        self._outage = _outage_of(str(conf.get("bootstrap.servers", "")))
        try:
            backoff_s = float(conf.get("reconnect.backoff.ms", 100)) / 1000.0
        except ValueError:
            backoff_s = 0.1
        self._quiet_s = max(self._quiet_s, 3 * backoff_s)

    @property
    def down_since(self) -> float | None:
        """When the current outage began (monotonic clock), or None while none is open."""
        return self._outage.down_since

    def __call__(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
            log.error(
                "fatal Kafka client error",
                extra=fields(client=self.client, error=err.str(), action="restart"),
            )
            return
        if err.code() in _UNREACHABLE:
            self._unreachable(err.str())
            return
        dropped = self._errors.admit(err.code())
        if dropped is not None:
            log.warning(
                "Kafka client error",
                extra=fields(client=self.client, error=err.str(), suppressed=dropped),
            )

    def _action(self) -> str:
        return (
            f"check that a Kafka broker is running at bootstrap.servers "
            f"({self._outage.bootstrap}) and that this host can reach it (address, port, "
            "firewall, DNS, security settings); the clients keep reconnecting meanwhile"
        )

    def _unreachable(self, error: str) -> None:
        now = time.monotonic()
        o = self._outage
        with o.lock:
            o.last_error_at = now
            o.clients.add(self.client)
            if o.down_since is None:
                o.down_since, o.last_line_at, o.suppressed = now, now, 0
                summary = None
            elif now - o.last_line_at >= self._summary_s:
                summary = (round(now - o.down_since, 1), o.suppressed, sorted(o.clients))
                o.last_line_at, o.suppressed = now, 0
            else:
                o.suppressed += 1
                return
        if summary is None:
            log.warning(
                "Kafka broker unreachable; waiting for it",
                extra=fields(
                    bootstrap=o.bootstrap,
                    client=self.client,
                    error=error,
                    action=self._action(),
                ),
            )
            return
        down_s, suppressed, clients = summary
        log.warning(
            "Kafka broker still unreachable",
            extra=fields(
                bootstrap=o.bootstrap,
                down_s=down_s,
                errors_suppressed=suppressed,
                clients=clients,
                error=error,
                action=self._action(),
            ),
        )

    def alive(self) -> None:
        """Called when the client made progress: ends an outage once errors have stopped."""
        now = time.monotonic()
        o = self._outage
        with o.lock:
            if o.down_since is None or now - o.last_error_at < self._quiet_s:
                return
            down_s, suppressed = round(now - o.down_since, 1), o.suppressed
            o.down_since, o.suppressed = None, 0
            o.clients.clear()
        log.info(
            "Kafka broker reachable again",
            extra=fields(
                bootstrap=o.bootstrap,
                client=self.client,
                down_s=down_s,
                errors_suppressed=suppressed,
            ),
        )

    def statistics(self, payload: str) -> None:
        """librdkafka statistics (``stats_cb``): a broker connection that is up ends an outage."""
        if self._outage.down_since is None:
            return
        try:
            brokers = json.loads(payload).get("brokers", {})
        except ValueError:
            return
        if any(b.get("state") == "UP" for b in brokers.values() if isinstance(b, dict)):
            self.alive()
