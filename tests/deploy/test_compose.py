"""docker/compose.yaml: the stack's services, images, health checks and volumes."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import pytest

from .support import (
    DASHBOARD,
    DASHBOARD_PROVIDERS,
    DATASOURCES,
    DOCKER,
    DOCKERFILE,
    PROMETHEUS_CONFIG,
    ROOT,
    dockerfile_instructions,
    is_pinned,
    load_compose,
    load_yaml,
    project_version,
)

SERVICES = ("kafka", "kafka-init", "stream-dedup", "load-sample", "prometheus", "grafana")


def service(name: str) -> dict[str, Any]:
    svc: dict[str, Any] = load_compose()["services"][name]
    return svc


def mounts(svc: dict[str, Any]) -> dict[str, str]:
    """``{container path: source}`` of a service's short-syntax volumes."""
    out = {}
    for entry in svc.get("volumes", []):
        assert isinstance(entry, str), f"use the short volume syntax: {entry}"
        source, target = entry.split(":")[:2]
        out[target] = source
    return out


def named_volume(svc: dict[str, Any], target: str) -> str:
    source = mounts(svc).get(target)
    assert source is not None, f"nothing mounted at {target}"
    assert not source.startswith((".", "/")), f"{target} should be a named volume: {source}"
    return source


def test_compose_file_parses_and_has_the_stack() -> None:
    compose = load_compose()
    assert set(compose["services"]) == set(SERVICES)
    assert "version" not in compose, "the Compose specification has no top-level version"


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_has_a_pinned_image(name: str) -> None:
    image = service(name).get("image")
    assert image, f"{name} has no image"
    assert is_pinned(image), f"{name}: pin the image to a version, not {image!r}"


def test_built_image_is_tagged_with_the_project_version() -> None:
    for name in ("stream-dedup", "load-sample"):
        svc = service(name)
        assert svc["image"] == f"stream-dedup:{project_version()}"
        build = svc["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_has_a_healthcheck(name: str) -> None:
    check = service(name).get("healthcheck")
    assert check and not check.get("disable"), f"{name} has no healthcheck"
    test = check["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, test
    assert check.get("interval") and check.get("timeout") and check.get("retries")


def test_named_volumes_are_declared_and_bind_mounts_exist() -> None:
    compose = load_compose()
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, svc in compose["services"].items():
        for target, source in mounts(svc).items():
            assert PurePosixPath(target).is_absolute(), f"{name}: {target}"
            if source.startswith((".", "/")):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which does not exist"
            else:
                used.add(source)
    assert used <= declared, f"volumes used but not declared: {used - declared}"
    assert declared <= used, f"volumes declared but not used: {declared - used}"


def test_kafka_is_a_single_node_kraft_broker_on_a_volume() -> None:
    kafka = service("kafka")
    assert kafka["image"].startswith("apache/kafka:")
    env = {k: str(v) for k, v in kafka["environment"].items()}
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node}@kafka:")
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert f"{controller}://" in env["KAFKA_LISTENERS"]
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", key
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    named_volume(kafka, env["KAFKA_LOG_DIRS"])
    assert "kafka-broker-api-versions.sh" in " ".join(kafka["healthcheck"]["test"])


def test_topics_are_created_before_the_service_starts() -> None:
    script = " ".join(service("kafka-init")["entrypoint"])
    words = set(re.split(r"[\s;]+", script))
    for topic in ("news", "news.unique", "news.duplicates", "news.dlq"):
        assert topic in words, topic
    assert "--if-not-exists" in script
    deps = service("stream-dedup")["depends_on"]
    assert deps["kafka"]["condition"] == "service_healthy"
    assert deps["kafka-init"]["condition"] == "service_completed_successfully"


def test_stream_dedup_service_keeps_its_index_and_restarts() -> None:
    svc = service("stream-dedup")
    assert svc["restart"] == "unless-stopped"
    env = svc["environment"]
    assert env["STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
    volume_dirs = [a for kw, a in dockerfile_instructions() if kw == "VOLUME"]
    assert volume_dirs, "the Dockerfile declares no VOLUME"
    index_dir = PurePosixPath(env["STREAM_DEDUP_INDEX__PATH"]).parent
    named_volume(svc, str(index_dir))
    assert f'"{index_dir}"' in volume_dirs[0] or str(index_dir) in volume_dirs[0].split()
    assert "9400:9400" in svc["ports"]


def test_load_sample_is_a_one_shot_producer_of_the_sample_stream() -> None:
    svc = service("load-sample")
    assert svc["restart"] == "no"
    assert svc["entrypoint"] == [
        "sh",
        "-c",
        "stream-dedup generate -n 5000 | stream-dedup produce - --topic news "
        "--bootstrap-servers kafka:9092",
    ]
    assert svc["image"] == service("stream-dedup")["image"]


def test_prometheus_has_its_config_rules_and_data_volume() -> None:
    svc = service("prometheus")
    targets = mounts(svc)
    assert (DOCKER / targets["/etc/prometheus/prometheus.yml"]).resolve() == PROMETHEUS_CONFIG
    config = load_yaml(PROMETHEUS_CONFIG)
    for rule_file in config.get("rule_files", []):
        assert f"/etc/prometheus/{rule_file}" in targets, f"{rule_file} is not mounted"
    storage = next(a for a in svc["command"] if a.startswith("--storage.tsdb.path="))
    named_volume(svc, storage.split("=", 1)[1])
    assert "/-/healthy" in " ".join(svc["healthcheck"]["test"])


def test_prometheus_scrapes_the_service_every_5s() -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "stream-dedup")
    assert job["scrape_interval"] == "5s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["stream-dedup:9400"]
    assert ("EXPOSE", "9400") in dockerfile_instructions()


def test_grafana_is_provisioned_with_the_datasource_and_dashboard() -> None:
    svc = service("grafana")
    targets = mounts(svc)
    named_volume(svc, "/var/lib/grafana")
    provisioning = DOCKER / targets["/etc/grafana/provisioning"]
    assert provisioning.resolve() == DATASOURCES.parents[1]
    (provider,) = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    dashboards_dir = provider["options"]["path"]
    assert (DOCKER / targets[dashboards_dir]).resolve() == DASHBOARD.parent
    (datasource,) = load_yaml(DATASOURCES)["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "/api/health" in " ".join(svc["healthcheck"]["test"])
    home = svc["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home is None or home == f"{dashboards_dir}/{DASHBOARD.name}"
