"""IndexOutage: retries while Redis is unreachable, tells it in few lines, and gives up at
its limit. The step here is a function that fails a given number of times; the service
tests with a real Redis are in ``tests/integration/test_index_outage.py``."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from stream_dedup.errors import IndexLeaseLostError, IndexUnreachableError
from stream_dedup.service.index_outage import IndexOutage
from stream_dedup.service.metrics import Metrics


class Flaky:
    """Fails ``failures`` times as an unreachable Redis does, then returns its count."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise IndexUnreachableError("redis://r:6379/0", "taking the lease", "refused")
        return self.calls


def outage(limit_s: float, registry: CollectorRegistry, summary_s: float = 60.0) -> IndexOutage:
    return IndexOutage(limit_s, Metrics(registry), lambda: True, (0.001, 0.002), summary_s)


def test_a_short_outage_is_retried_and_told_in_two_lines(
    package_logs: list[logging.LogRecord],
) -> None:
    registry = CollectorRegistry()
    watch = outage(30.0, registry)
    assert watch.call("deciding", Flaky(5)) == 6
    assert watch.down_since is None
    assert registry.get_sample_value("stream_dedup_index_retries_total") == 5
    assert registry.get_sample_value("stream_dedup_index_up") == 1
    said = [r.getMessage() for r in package_logs if r.name == "stream_dedup.service.index"]
    assert said == ["shared index unreachable; retrying", "shared index reachable again"]
    assert package_logs[-1].__dict__["fields"]["retries"] == 5


def test_a_long_outage_is_summarized(package_logs: list[logging.LogRecord]) -> None:
    watch = outage(30.0, CollectorRegistry(), summary_s=0.0)
    watch.call("deciding", Flaky(3))
    said = [r.getMessage() for r in package_logs if r.name == "stream_dedup.service.index"]
    assert said.count("shared index still unreachable") == 2


def test_a_zero_limit_stops_at_the_first_failure() -> None:
    registry = CollectorRegistry()
    step = Flaky(1)
    with pytest.raises(IndexUnreachableError, match=r"over index\.redis\.outage_limit_s = 0 s"):
        outage(0.0, registry).call("deciding", step)
    assert step.calls == 1
    assert registry.get_sample_value("stream_dedup_index_up") == 0


def test_a_stop_ends_the_wait_and_other_index_errors_are_not_outages() -> None:
    stopping = IndexOutage(30.0, Metrics(CollectorRegistry()), lambda: False, (0.001, 0.002))
    with pytest.raises(IndexUnreachableError, match=r"\(refused\)"):
        stopping.call("deciding", Flaky(1))

    def lease_lost() -> None:
        raise IndexLeaseLostError("redis://r:6379/0")

    with pytest.raises(IndexLeaseLostError):
        outage(30.0, CollectorRegistry()).call("deciding", lease_lost)
