"""The metrics known only at scrape time: the index's size and state, the consumer lag,
where documents were sketched, and a shared index's failed applies.

Read when Prometheus scrapes rather than pushed from the hot loop: the index's stats come
from :attr:`Metrics.index_source <stream_dedup.service.metrics.Metrics.index_source>` and the
lag from the last librdkafka statistics the :class:`~stream_dedup.service.metrics.Metrics`
kept. The table of names is in :mod:`stream_dedup.service.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stream_dedup.errors import IndexUnreachableError

if TYPE_CHECKING:
    from stream_dedup.service.metrics import Metrics

#: The prefix of every metric of the service.
PREFIX = "stream_dedup"

__all__ = ["PREFIX", "ScrapeCollector"]


class ScrapeCollector(Collector):
    """Index size, consumer lag and sketch counts, read when Prometheus scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        docs = GaugeMetricFamily(
            f"{PREFIX}_index_documents", "Documents decided and recorded in the index."
        )
        size = GaugeMetricFamily(f"{PREFIX}_index_size_bytes", "Index size on disk, in bytes.")
        filters = GaugeMetricFamily(
            f"{PREFIX}_index_filter_bytes", "Memory held by the index's key filters, in bytes."
        )
        held = GaugeMetricFamily(
            f"{PREFIX}_index_held_documents",
            "Documents the index holds: indexed and not expired by retention.",
        )
        evicted = CounterMetricFamily(
            f"{PREFIX}_index_evicted_documents", "Documents expired by retention."
        )
        oldest = GaugeMetricFamily(
            f"{PREFIX}_index_oldest_document_timestamp_seconds",
            "Unix time (stream clock) at which the oldest held document was decided.",
        )
        clock = GaugeMetricFamily(
            f"{PREFIX}_index_clock_timestamp_seconds",
            "The stream's clock: the latest document time decided, Unix seconds.",
        )
        epochs = GaugeMetricFamily(
            f"{PREFIX}_index_epochs", "Live epochs of the index (slices of the retention)."
        )
        source = self._m.index_source
        try:
            read = source() if source is not None else None
        except IndexUnreachableError:  # left out while Redis is away (stream_dedup_index_up)
            read = None
        if read is not None:
            stats, n_filter = read
            docs.add_metric([], stats.documents)
            size.add_metric([], stats.size_bytes)
            filters.add_metric([], n_filter)
            held.add_metric([], stats.held)
            evicted.add_metric([], stats.expired)
            if stats.oldest_time is not None:
                oldest.add_metric([], stats.oldest_time)
            if stats.clock is not None:
                clock.add_metric([], stats.clock)
            epochs.add_metric([], stats.epochs)
        yield from (docs, size, filters, held, evicted, oldest, clock, epochs)
        lag = GaugeMetricFamily(
            f"{PREFIX}_consumer_lag_messages",
            "Messages behind the partition end, from librdkafka statistics.",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(self._m.lag().items()):
            lag.add_metric([topic, str(partition)], value)
        yield lag
        yield from self._sketched()
        yield from self._apply_failures()

    def _apply_failures(self) -> Iterator[CounterMetricFamily]:
        """A shared index's writes whose apply after the commit point failed: nothing is
        lost (the next write applies their redo records first), but until one succeeds
        every lease reads through the records left waiting."""
        failures = CounterMetricFamily(
            f"{PREFIX}_index_apply_failures",
            "Shared index: writes whose apply after their commit point failed; their redo "
            "records wait for the next write.",
        )
        source = self._m.apply_failures_source
        if source is not None:
            failures.add_metric([], source())
        yield failures

    def _sketched(self) -> Iterator[CounterMetricFamily]:
        """Where the documents decided were sketched: a backlog whose documents are
        mostly sketched in the service process is not pipelined (``docs/group-order.md``)."""
        sketched = CounterMetricFamily(
            f"{PREFIX}_sketched_documents",
            "Documents sketched to be decided: by the sketch worker ahead of their batch, "
            "or in the service process.",
            labels=["by"],
        )
        source = self._m.sketch_source
        if source is not None:
            by_worker, here = source()
            sketched.add_metric(["worker"], by_worker)
            sketched.add_metric(["service"], here)
        yield sketched
