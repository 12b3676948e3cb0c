"""docker/compose.yaml: the stack's services, images, health checks and volumes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from .support import (
    COMPOSE,
    DASHBOARD,
    DASHBOARD_PROVIDERS,
    DATASOURCES,
    DOCKER,
    DOCKERFILE,
    PROMETHEUS_CONFIG,
    ROOT,
    dockerfile_env,
    dockerfile_instructions,
    is_pinned,
    load_compose,
    load_yaml,
    project_version,
)

DEFAULT_SERVICES = ("kafka", "kafka-init", "stream-dedup", "load-sample", "prometheus", "grafana")
#: Started only with ``--profile redis``: replicas sharing one index in Redis.
REDIS_PROFILE = ("redis", "kafka-init-shared", "dedup-shared")
SERVICES = DEFAULT_SERVICES + REDIS_PROFILE


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


def test_the_default_stack_has_no_profile_and_the_shared_index_is_profile_redis() -> None:
    for name in DEFAULT_SERVICES:
        assert "profiles" not in service(name), f"{name} would not start without a profile"
    for name in REDIS_PROFILE:
        assert service(name).get("profiles") == ["redis"], name
    # nothing in the default stack waits for a service it would not start
    for name in DEFAULT_SERVICES:
        assert not set(service(name).get("depends_on") or ()) & set(REDIS_PROFILE), name


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_has_a_pinned_image(name: str) -> None:
    image = service(name).get("image")
    assert image, f"{name} has no image"
    assert is_pinned(image), f"{name}: pin the image to a version, not {image!r}"


def test_built_image_is_tagged_with_the_project_version() -> None:
    for name in ("stream-dedup", "load-sample", "dedup-shared"):
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
    checks = next(j for j in config["scrape_configs"] if j["job_name"] == "stream-dedup-checks")
    assert checks["scrape_interval"] == "5s"
    assert [t for sc in checks["static_configs"] for t in sc["targets"]] == ["stream-dedup:9401"]
    assert ("EXPOSE", "9400 9401") in dockerfile_instructions()


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


def test_grafana_needs_its_admin_password_and_has_no_anonymous_access() -> None:
    env = {k: str(v) for k, v in service("grafana")["environment"].items()}
    # ${VAR:?message}: Compose refuses to start without it; no default password.
    required = re.fullmatch(
        r"\$\{GRAFANA_ADMIN_PASSWORD:\?(.+)\}", env["GF_SECURITY_ADMIN_PASSWORD"]
    )
    assert required and "GRAFANA_ADMIN_PASSWORD" in required.group(1)
    assert env.get("GF_AUTH_ANONYMOUS_ENABLED", "false") == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert "GRAFANA_ADMIN_PASSWORD:-" not in COMPOSE.read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "GRAFANA_ADMIN_PASSWORD" in readme and "admin/admin" not in readme


# --- profile `redis` -------------------------------------------------------------------


def shared_env() -> dict[str, str]:
    return {k: str(v) for k, v in service("dedup-shared")["environment"].items()}


def test_redis_keeps_the_index_on_a_volume_and_answers_ping() -> None:
    redis = service("redis")
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    assert command[0] == "redis-server"
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--appendonly"] == "yes", "the index must survive a Redis restart"
    assert options.get("--maxmemory-policy", "noeviction") == "noeviction"
    named_volume(redis, "/data")
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert redis["restart"] == "unless-stopped"
    assert "ports" not in redis, "the stack reaches Redis as redis:6379"


def test_shared_service_runs_replicas_of_the_service_image() -> None:
    svc = service("dedup-shared")
    main = service("stream-dedup")
    assert svc["image"] == main["image"] and svc["build"] == main["build"]
    assert "entrypoint" not in svc and "command" not in svc, "run as the image runs"
    assert svc["deploy"]["replicas"] == 2
    # replicas cannot share a fixed host port, a container name or an index directory
    assert "ports" not in svc and "container_name" not in svc
    assert "volumes" not in svc
    assert svc["healthcheck"]["test"] == main["healthcheck"]["test"]
    assert svc["stop_grace_period"] == main["stop_grace_period"]
    assert svc["restart"] == "unless-stopped"


def test_shared_service_uses_the_redis_index_backend() -> None:
    env = shared_env()
    assert env["STREAM_DEDUP_INDEX__BACKEND"] == "redis"
    url = urlsplit(env["STREAM_DEDUP_INDEX__REDIS__URL"])
    assert url.scheme == "redis"
    assert url.hostname == "redis", "point the index at the redis service"
    assert (url.port or 6379) == 6379
    assert "STREAM_DEDUP_INDEX__PATH" not in env, "index.path is unused with backend redis"
    delivery = env.get("STREAM_DEDUP_SERVICE__DELIVERY", "at-least-once")
    assert delivery == "at-least-once", "exactly-once needs an id per replica (group.instance.id)"


def test_shared_replicas_form_a_group_of_their_own() -> None:
    env = shared_env()
    main = {k: str(v) for k, v in service("stream-dedup")["environment"].items()}
    assert (
        env["STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS"]
        == main["STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS"]
    )
    assert env["STREAM_DEDUP_INPUT__TOPICS"] == main["STREAM_DEDUP_INPUT__TOPICS"] == "news"
    # one group for both replicas (one environment), not stream-dedup's: a member with a
    # RocksDB index of its own must not take partitions from the shared index
    group = env["STREAM_DEDUP_KAFKA__GROUP_ID"]
    assert group and group != main.get("STREAM_DEDUP_KAFKA__GROUP_ID", "stream-dedup")
    assert env["STREAM_DEDUP_KAFKA__PARTITION_ASSIGNMENT_STRATEGY"] == "cooperative-sticky"


def test_shared_service_writes_topics_of_its_own_created_before_it_starts() -> None:
    env = shared_env()
    outputs = [
        env["STREAM_DEDUP_OUTPUT__UNIQUE_TOPIC"],
        env["STREAM_DEDUP_OUTPUT__DUPLICATE_TOPIC"],
        env["STREAM_DEDUP_OUTPUT__DLQ_TOPIC"],
    ]
    assert not {"news.unique", "news.duplicates", "news.dlq"} & set(outputs)
    script = " ".join(service("kafka-init-shared")["entrypoint"])
    words = set(re.split(r"[\s;]+", script))
    assert set(outputs) <= words
    assert "--if-not-exists" in script
    assert service("kafka-init-shared")["restart"] == "no"


def test_shared_service_waits_for_kafka_its_topics_and_redis() -> None:
    deps = service("dedup-shared")["depends_on"]
    assert deps["kafka"]["condition"] == "service_healthy"
    assert deps["redis"]["condition"] == "service_healthy"
    assert deps["kafka-init"]["condition"] == "service_completed_successfully"
    assert deps["kafka-init-shared"]["condition"] == "service_completed_successfully"
    assert service("kafka-init-shared")["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_shared_service_environment_loads_as_a_redis_backed_config() -> None:
    """The image's ENV and the Compose environment, through the service's own loader."""
    from stream_dedup.service.config import IndexConfig
    from stream_dedup.service.config_loading import load_config

    if "backend" not in {f.name for f in dataclasses.fields(IndexConfig)}:
        pytest.skip("index.backend is not in this tree yet")
    env = dockerfile_env(dockerfile_instructions())
    env.update(shared_env())
    config = load_config(ROOT / "config" / "stream-dedup.toml", environ=env)
    assert config.index.backend == "redis"
    assert config.index.redis.url == "redis://redis:6379/0"
    assert config.kafka["group.id"] == "stream-dedup-shared"
    assert config.kafka["partition.assignment.strategy"] == "cooperative-sticky"


def test_prometheus_scrapes_every_shared_replica() -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "stream-dedup-shared")
    assert job["scrape_interval"] == "5s"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["dedup-shared"] and sd["type"] == "A" and sd["port"] == 9400
    assert "static_configs" not in job, "a static name reaches one replica per scrape"
    down = next(
        rule
        for group in load_yaml(PROMETHEUS_CONFIG.parent / "alerts.yml")["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "StreamDedupDown"
    )
    match = re.search(r'job=~"([^"]+)"', down["expr"])
    assert match, f"StreamDedupDown should cover both jobs: {down['expr']}"
    for name in ("stream-dedup", "stream-dedup-shared"):
        assert re.fullmatch(match.group(1), name), down["expr"]
