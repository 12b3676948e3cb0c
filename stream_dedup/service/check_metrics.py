"""The check endpoints' metrics (:mod:`stream_dedup.service.check_http`): requests by
outcome and their latency, registered by :class:`~stream_dedup.service.metrics.Metrics`
on its registry, named and listed with the service's other metrics there."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CHECK_OUTCOMES", "CheckMetrics", "CheckProcessMetrics"]

#: What became of a check request: answered, refused with a 400 or 411, with a 413,
#: with a 503 (the index not open), or failed reading the index (500).
CHECK_OUTCOMES = ("ok", "bad_request", "too_large", "unavailable", "failed")
#: A check answers in milliseconds; 20 ms is the latency it is held to at p99.
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
#: A follow of the index: ~1 ms with nothing new, tens to hundreds of ms for a large batch.
_FOLLOW_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class CheckMetrics:
    """``stream_dedup_check_requests_total{outcome}`` (every outcome at zero from the
    start), ``stream_dedup_check_duration_seconds`` and, in the check process,
    ``stream_dedup_check_follow_seconds``: each follow of the committed index, with, on
    RocksDB, ``stream_dedup_check_readers`` and ``stream_dedup_check_reader_restarts_total``
    (:mod:`.check_readers`). Why follows are timed: a follow replays the writer's new log
    records, and the binding keeps the interpreter lock for all of it, so a follow's
    length is how long a reader is out of service (and, on Redis, where the check process
    follows itself, how long its checks wait)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "stream_dedup_check_requests",
            "Check requests (POST /check, /check/batch) answered, by outcome.",
            ["outcome"],
            registry=r,
        )
        for outcome in CHECK_OUTCOMES:
            self.requests.labels(outcome)
        self.duration = Histogram(
            "stream_dedup_check_duration_seconds",
            "One check request, from its body read to its answer (index reads and scoring).",
            buckets=_BUCKETS,
            registry=r,
        )
        self.follow = Histogram(
            "stream_dedup_check_follow_seconds",
            "One follow of the committed index by the check process (a RocksDB catch-up "
            "with the writer's log by one of its readers, then its counters re-read).",
            buckets=_FOLLOW_BUCKETS,
            registry=r,
        )
        self.readers = Gauge(
            "stream_dedup_check_readers",
            "The check process's reader processes answering reads (RocksDB: 2 when both "
            "serve; while one is down the other catches up with checks held back).",
            registry=r,
        )
        self.reader_restarts = Counter(
            "stream_dedup_check_reader_restarts",
            "Times a reader of the check process was found dead and started again.",
            registry=r,
        )


class CheckProcessMetrics:
    """The check process's health, kept by the service that starts it
    (:mod:`stream_dedup.service.check_process`): ``stream_dedup_check_process_up`` (1
    while it serves) and ``stream_dedup_check_process_restarts_total``. Its requests are
    counted by the process itself, on its own port's ``/metrics``."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.up = Gauge(
            "stream_dedup_check_process_up",
            "1 while the check process answers checks on http.check_port, else 0.",
            registry=r,
        )
        self.restarts = Counter(
            "stream_dedup_check_process_restarts",
            "Times the check process was found dead and started again.",
            registry=r,
        )
