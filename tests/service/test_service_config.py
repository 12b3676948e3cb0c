"""Service configuration: the documented file, layering, errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_dedup.errors import ConfigError
from stream_dedup.service.config import (
    ServiceConfig,
    build_config,
    load_config,
    parse_assignments,
    read_env,
)
from stream_dedup.service.kafka import client_config

DOCUMENTED = Path(__file__).resolve().parents[2] / "config" / "stream-dedup.toml"


def test_documented_file_lists_every_default() -> None:
    assert load_config(DOCUMENTED, environ={}) == ServiceConfig()


def test_documented_file_names_every_setting() -> None:
    text = DOCUMENTED.read_text()
    config = ServiceConfig()
    for section in ("input", "output", "dedup", "index", "batch", "service", "http", "log"):
        assert f"[{section}]" in text
        for name in getattr(config, section).__dataclass_fields__:
            assert f"\n{name} = " in text, f"{section}.{name} is not documented"


def test_layers_file_then_env_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[batch]\nmax_wait_ms = 5\nmax_messages = 10\n[kafka]\n"linger.ms" = 7\n')
    env = {"STREAM_DEDUP_BATCH__MAX_WAIT_MS": "50", "STREAM_DEDUP_KAFKA__GROUP_ID": "g1"}
    flags = parse_assignments(["batch.max_messages=99", "input.topics=a,b"])
    config = load_config(path, environ=env, overrides=flags)
    assert config.batch.max_wait_ms == 50
    assert config.batch.max_messages == 99
    assert config.input.topics == ("a", "b")
    assert config.kafka["group.id"] == "g1"
    assert config.kafka["linger.ms"] == "7"
    assert config.unique_topic == "a.unique"
    assert config.duplicate_topic == "a.duplicates"
    assert config.dlq_topic == "a.dlq"


@pytest.mark.parametrize(
    ("layer", "key"),
    [
        ({"batch": {"max_wiat_ms": 5}}, "batch.max_wiat_ms"),
        ({"batch": {"max_wait_ms": "soon"}}, "batch.max_wait_ms"),
        ({"http": {"enabled": "perhaps"}}, "http.enabled"),
        ({"dedup": {"threshold": 1.5}}, "dedup.threshold"),
        ({"input": {"format": "xml"}}, "input.format"),
        ({"bogus": {"x": 1}}, "bogus"),
        ({"kafka": {"linger.ms": [1]}}, "kafka.linger.ms"),
        ({"service": {"sketch_inline_max": -1}}, "service.sketch_inline_max"),
    ],
)
def test_bad_settings_name_the_key(layer: dict[str, dict[str, object]], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config([layer])
    assert info.value.key == key


def test_env_needs_section_and_key() -> None:
    with pytest.raises(ConfigError):
        read_env({"STREAM_DEDUP_THRESHOLD": "0.9"})


def test_kafka_settings_merge_defaults_user_enforced() -> None:
    user = {
        "bootstrap.servers": "b:9092",
        "group.id": "g",
        "enable.auto.commit": "true",
        "linger.ms": "9",
        "acks": "1",
        "security.protocol": "SASL_SSL",
        "consumer.fetch.wait.max.ms": "10",
        "producer.compression.type": "lz4",
    }
    consumer = client_config("consumer", user)
    producer = client_config("producer", user)
    assert consumer["enable.auto.commit"] == "false"  # enforced beats the user
    assert consumer["enable.auto.offset.store"] == "false"
    assert consumer["fetch.wait.max.ms"] == "10"
    assert consumer["auto.offset.reset"] == "earliest"  # our default
    assert "linger.ms" not in consumer and "compression.type" not in consumer
    assert producer["acks"] == "all"
    assert producer["linger.ms"] == "9"  # the user beats our default
    assert producer["compression.type"] == "lz4"
    assert "group.id" not in producer and "fetch.wait.max.ms" not in producer
    assert consumer["security.protocol"] == producer["security.protocol"] == "SASL_SSL"
