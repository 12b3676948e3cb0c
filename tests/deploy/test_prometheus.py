"""docker/prometheus: promtool accepts the config, and a real Prometheus server scraping a
running service answers every dashboard query and evaluates every alert rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dedup.tools.broker import free_port

from .conftest import RunningService
from .support import (
    PROMETHEUS_CONFIG,
    dashboard_queries,
    instant_query,
    load_dashboard,
    load_yaml,
    rule_queries,
)

#: Queries whose answer must not be empty once documents went through.
KEY_METRICS = ("stream_dedup_messages_consumed_total", "stream_dedup_verdicts_total")
#: Stands in for Grafana's $__rate_interval: enough 1 s scrapes to cover the test's load.
RATE_INTERVAL = "30s"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found: install the Debian package `prometheus` (.ci/run does)")
    return path


def test_promtool_accepts_the_config_and_its_rules() -> None:
    promtool = tool("promtool")
    done = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr
    assert len(rule_queries()) >= 5


class PrometheusServer:
    """A Prometheus process on a free loopback port with a temporary store."""

    def __init__(self, binary: str, config: Path, workdir: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def api(self, path: str, **params: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body: dict[str, Any] = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400/422 carry the error as JSON
            with exc:
                body = json.load(exc)
        return body

    def query(self, promql: str) -> dict[str, Any]:
        return self.api("query", query=promql)

    def wait_until(self, what: str, check: Any, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log()}"
            try:
                if check():
                    return
            except (OSError, ValueError):
                pass  # not listening yet, or a 503 in plain text while it starts
            time.sleep(0.25)
        raise AssertionError(f"prometheus: {what} not within {timeout_s}s:\n{self.log()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def scalar_values(answer: dict[str, Any]) -> list[float]:
    return [float(r["value"][1]) for r in answer["data"]["result"]]


def scrape_config_for(service: RunningService, workdir: Path) -> Path:
    """The project's Prometheus config, scraping the test service every second."""
    config = load_yaml(PROMETHEUS_CONFIG)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "stream-dedup")
    job["scrape_interval"] = "1s"
    job["scrape_timeout"] = "1s"
    for static in job["static_configs"]:
        static["targets"] = [service.url.removeprefix("http://")]
    config["scrape_configs"] = [job]
    for rule_file in config.get("rule_files", []):
        shutil.copy(PROMETHEUS_CONFIG.parent / rule_file, workdir / rule_file)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture
def prometheus(service: RunningService, tmp_path: Path) -> Iterator[PrometheusServer]:
    binary = tool("prometheus")
    server = PrometheusServer(binary, scrape_config_for(service, tmp_path), tmp_path)
    try:
        server.wait_until(
            "the service scraped",
            lambda: scalar_values(server.query('up{job="stream-dedup"}')) == [1.0],
        )
        yield server
    finally:
        server.stop()


@pytest.mark.broker
@pytest.mark.slow
def test_prometheus_answers_every_dashboard_query_with_data(
    service: RunningService, prometheus: PrometheusServer
) -> None:
    # a second, larger sample while Prometheus watches, so rates and quantiles have data
    service.load_sample(documents=700)
    exposition = service.wait_processed()
    consumed = next(
        float(line.split()[-1])
        for line in exposition.splitlines()
        if line.startswith("stream_dedup_messages_consumed_total ")
    )
    prometheus.wait_until(
        "the last documents scraped",
        lambda: (
            scalar_values(prometheus.query("stream_dedup_messages_consumed_total")) == [consumed]
        ),
    )

    failures = []
    for where, expr in dashboard_queries(load_dashboard()):
        answer = prometheus.query(instant_query(expr, RATE_INTERVAL))
        if answer.get("status") != "success":
            failures.append(f"{where}: {answer.get('error')}")
            continue
        if any(m in expr for m in KEY_METRICS):
            values = scalar_values(answer)
            if not values or not any(v > 0 for v in values):
                failures.append(f"{where}: no data ({answer['data']['result']})")
    assert failures == []

    lag = prometheus.query("stream_dedup_consumer_lag_messages")["data"]["result"]
    assert {r["metric"]["topic"] for r in lag} == {service.topics.input}
    quantile = prometheus.query(
        instant_query(
            "histogram_quantile(0.99, sum by (le) "
            "(rate(stream_dedup_document_latency_seconds_bucket[$__rate_interval])))",
            RATE_INTERVAL,
        )
    )
    assert 0 < scalar_values(quantile)[0] < 60


@pytest.mark.broker
@pytest.mark.slow
def test_prometheus_loads_and_evaluates_every_alert_rule(
    service: RunningService, prometheus: PrometheusServer
) -> None:
    expected = {where.split("'")[1] for where, _ in rule_queries()}

    def evaluated() -> list[dict[str, Any]]:
        groups = prometheus.api("rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = all(r["lastEvaluation"] > "0001-01-01T00:00:00Z" for r in rules)
        return rules if done and rules else []

    prometheus.wait_until("every rule evaluated", evaluated)
    rules = evaluated()
    assert {r["name"] for r in rules} == expected
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
