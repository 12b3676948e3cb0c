"""The Grafana dashboard and the Prometheus rules name only metrics the service exports."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from stream_dedup.service.metrics import Metrics

from .conftest import RunningService
from .support import (
    DATASOURCES,
    dashboard_queries,
    exported_families,
    family_of,
    instant_query,
    load_dashboard,
    load_yaml,
    metric_names,
    rule_queries,
    unknown_names,
)

#: What the dashboard must show (issue: throughput, verdict mix and duplicate rate,
#: latency p50/p99, consumer lag, dead letters by reason, index size, candidates).
REQUIRED = {
    "stream_dedup_messages_consumed_total",
    "stream_dedup_verdicts_total",
    "stream_dedup_document_latency_seconds_bucket",
    "stream_dedup_batch_duration_seconds_bucket",
    "stream_dedup_consumer_lag_messages",
    "stream_dedup_dead_letters_total",
    "stream_dedup_index_size_bytes",
    "stream_dedup_index_documents",
    "stream_dedup_candidates_per_document_bucket",
}


def all_queries() -> list[tuple[str, str]]:
    return dashboard_queries(load_dashboard()) + rule_queries()


def panels() -> list[dict[str, object]]:
    return [p for p in load_dashboard()["panels"] if p["type"] != "row"]


def test_every_dashboard_query_names_a_service_metric() -> None:
    queries = dashboard_queries(load_dashboard())
    assert len(queries) >= 20
    for where, expr in queries:
        assert metric_names(expr), f"{where} names no stream_dedup_ metric: {expr}"


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    named = set().union(*(metric_names(e) for _, e in dashboard_queries(load_dashboard())))
    assert named >= REQUIRED, f"not on the dashboard: {sorted(REQUIRED - named)}"
    exprs = " ".join(e for _, e in dashboard_queries(load_dashboard()))
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    assert 'verdict="duplicate"' in exprs, "no duplicate rate"
    assert "by (reason)" in exprs and "by (topic, partition)" in exprs


def test_dashboard_uses_the_provisioned_datasource() -> None:
    (datasource,) = load_yaml(DATASOURCES)["datasources"]
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels():
        assert panel["gridPos"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}
        for target in panel["targets"]:  # type: ignore[attr-defined]
            assert target["datasource"]["uid"] == datasource["uid"], panel["title"]


def test_names_resolve_to_families_of_the_metrics_registry() -> None:
    """Fast check without a broker: the families :class:`Metrics` registers."""
    registry = CollectorRegistry()
    Metrics(registry)
    families = exported_families(generate_latest(registry).decode())
    assert unknown_names(all_queries(), families) == []


def test_suffixes_map_to_histogram_and_counter_families() -> None:
    families = {"a_seconds": "histogram", "b_total": "counter", "c": "gauge"}
    assert family_of("a_seconds_bucket", families) == "a_seconds"
    assert family_of("a_seconds_count", families) == "a_seconds"
    assert family_of("b_total", families) == "b_total"
    assert family_of("c_bucket", families) is None
    assert family_of("c_total", families) is None
    assert metric_names("rate(stream_dedup_x_total[1m]) / up") == {"stream_dedup_x_total"}


@pytest.mark.broker
def test_names_resolve_to_families_a_running_service_exports(service: RunningService) -> None:
    families = service.families()
    ours = {n for n in families if n.startswith("stream_dedup_")}
    # the client library's creation-time series are switched off
    assert not [n for n in ours if n.endswith("_created")]
    assert len(ours) >= 15, sorted(ours)
    assert unknown_names(all_queries(), families) == []
    used = {family_of(n, families) for _, e in all_queries() for n in metric_names(e)}
    missing = ours - used
    assert not missing, f"exported but on no dashboard panel or alert: {sorted(missing)}"


#: The index's own values: every instance of a deployment on a shared (Redis) index exports
#: the same ones, so a panel counts them once per index, not once per instance.
SHARED_INDEX_SERIES = {
    "stream_dedup_index_documents": (100, 500),
    "stream_dedup_index_size_bytes": (1000, 7000),
    "stream_dedup_index_held_documents": (80, 400),
}
#: Per process (each instance's key filter is in its own memory): summed over instances.
PER_PROCESS_SERIES = {"stream_dedup_index_filter_bytes": (10, 20)}


def test_index_panels_count_a_shared_index_once(tmp_path: Path) -> None:
    """Evaluated by promtool over one instance with its own index (RocksDB) and two that
    share one (Redis): the shared index's gauges count once, the key filters per process."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: install the Debian package `prometheus`")
    own = 'job="stream-dedup",service="stream-dedup",instance="stream-dedup:9400"'
    shared = [
        f'job="stream-dedup-shared",service="dedup-shared",instance="10.0.0.{n}:9400"'
        for n in (2, 3)
    ]
    series: list[dict[str, str]] = []
    expected: dict[str, float] = {}
    for name, (mine, theirs) in SHARED_INDEX_SERIES.items():
        series.append({"series": f"{name}{{{own}}}", "values": f"{mine}x10"})
        series += [{"series": f"{name}{{{s}}}", "values": f"{theirs}x10"} for s in shared]
        expected[name] = mine + theirs
    for name, (mine, theirs) in PER_PROCESS_SERIES.items():
        series.append({"series": f"{name}{{{own}}}", "values": f"{mine}x10"})
        series += [{"series": f"{name}{{{s}}}", "values": f"{theirs}x10"} for s in shared]
        expected[name] = mine + 2 * theirs
    # Evictions: 60 a minute in the own index, 120 a minute in the shared one.
    evicted = "stream_dedup_index_evicted_documents_total"
    series.append({"series": f"{evicted}{{{own}}}", "values": "0+60x10"})
    series += [{"series": f"{evicted}{{{s}}}", "values": "0+120x10"} for s in shared]
    expected[evicted] = 3.0  # per second

    checks = []
    for _, expr in dashboard_queries(load_dashboard()):
        names = metric_names(expr)
        if len(names) != 1 or not names <= expected.keys() or not expr.startswith("sum("):
            continue
        (name,) = names
        checks.append(
            {
                "expr": instant_query(expr, "5m"),
                "eval_time": "8m",
                "exp_samples": [{"labels": "{}", "value": expected[name]}],
            }
        )
    panels_of = {n for _, e in dashboard_queries(load_dashboard()) for n in metric_names(e)}
    assert expected.keys() <= panels_of
    assert len(checks) >= 6, checks
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
    }
    spec = tmp_path / "index-panels.test.yml"
    spec.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
