"""Service configuration: the documented file, layering, errors naming the key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stream_dedup.errors import ConfigError
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.config_loading import (
    build_config,
    load_config,
    parse_assignments,
    read_env,
)
from stream_dedup.service.kafka_settings import client_config

DOCUMENTED = Path(__file__).resolve().parents[2] / "config" / "stream-dedup.toml"


def test_documented_file_lists_every_default() -> None:
    assert load_config(DOCUMENTED, environ={}) == ServiceConfig()


def test_documented_file_names_every_setting() -> None:
    text = DOCUMENTED.read_text()
    config = ServiceConfig()
    tables = {s: getattr(config, s) for s in ("input", "output", "dedup", "index", "batch")}
    tables |= {s: getattr(config, s) for s in ("service", "http", "log")}
    tables["index.redis"] = config.index.redis
    for section, values in tables.items():
        assert f"[{section}]" in text
        for name in values.__dataclass_fields__:
            if f"{section}.{name}" in tables:
                continue  # a nested table, documented as [section.name]
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


@pytest.mark.parametrize(
    ("layer", "key", "fix"),
    [
        ({"batch": {"max_messages": "2000"}}, "batch.max_messages", "max_messages = 2000"),
        ({"batch": {"max_wait_ms": 2.5}}, "batch.max_wait_ms", None),
        ({"batch": {"max_messages": True}}, "batch.max_messages", None),
        ({"http": {"enabled": "true"}}, "http.enabled", "enabled = true"),
        ({"http": {"port": "9400"}}, "http.port", "port = 9400"),
        ({"service": {"flush_timeout_s": "30"}}, "service.flush_timeout_s", "= 30.0"),
        ({"input": {"topics": "news,wire"}}, "input.topics", 'topics = ["news", "wire"]'),
        ({"input": {"content_fields": ["title", 3]}}, "input.content_fields", None),
        ({"index": {"path": 7}}, "index.path", None),
        ({"dedup": {"num_perm": "128"}}, "dedup.num_perm", "num_perm = 128"),
        ({"dedup": {"threshold": "0.9"}}, "dedup.threshold", "threshold = 0.9"),
        ({"dedup": {"shingle_kind": "line"}}, "dedup.shingle_kind", "'char', 'word'"),
        ({"dedup": {"verify": 1}}, "dedup.verify", None),
    ],
)
def test_a_file_value_must_have_the_settings_type(
    layer: dict[str, dict[str, object]], key: str, fix: str | None
) -> None:
    """A TOML value is not converted: "2000" is a string, and the message shows the fix."""
    with pytest.raises(ConfigError) as info:
        build_config([layer])
    assert info.value.key == key
    if fix is not None:
        assert fix in info.value.problem


def test_environment_and_flags_are_parsed_into_the_settings_types() -> None:
    """Environment variables and flags can only be strings: theirs are converted."""
    env = {
        "STREAM_DEDUP_BATCH__MAX_MESSAGES": "2000",
        "STREAM_DEDUP_HTTP__ENABLED": "false",
        "STREAM_DEDUP_SERVICE__FLUSH_TIMEOUT_S": "7",
        "STREAM_DEDUP_DEDUP__NUM_PERM": "64",
        "STREAM_DEDUP_DEDUP__SHINGLE_KIND": "word",
    }
    flags = parse_assignments(["http.port=0", "input.topics=a, b", "dedup.threshold=0.9"])
    config = load_config(None, environ=env, overrides=flags)
    assert config.batch.max_messages == 2000
    assert config.http.enabled is False and config.http.port == 0
    assert config.service.flush_timeout_s == 7.0
    assert config.input.topics == ("a", "b")
    assert (config.dedup.num_perm, config.dedup.threshold) == (64, 0.9)
    assert config.dedup.shingle_kind == "word"
    # a flag overrides a file's value and is parsed; a file's value under it is not
    layers = [{"batch": {"max_messages": "9"}}, parse_assignments(["batch.max_messages=9"])]
    assert build_config(layers).batch.max_messages == 9
    with pytest.raises(ConfigError, match=r"batch\.max_wait_ms"):
        load_config(None, environ={"STREAM_DEDUP_BATCH__MAX_WAIT_MS": "soon"})


@pytest.mark.parametrize(
    ("layer", "key"),
    [
        ({"http": {"port": 99999}}, "http.port"),
        ({"http": {"port": -1}}, "http.port"),
        ({"http": {"health_max_age_s": 0}}, "http.health_max_age_s"),
        ({"http": {"health_max_age_s": float("inf")}}, "http.health_max_age_s"),
        ({"http": {"host": ""}}, "http.host"),
        ({"service": {"flush_timeout_s": 0.0}}, "service.flush_timeout_s"),
        ({"service": {"switch_interval_ms": 0.0}}, "service.switch_interval_ms"),
        ({"service": {"switch_interval_ms": 5000.0}}, "service.switch_interval_ms"),
        ({"service": {"shutdown_timeout_s": -1.0}}, "service.shutdown_timeout_s"),
        ({"service": {"backoff_initial_s": 0}}, "service.backoff_initial_s"),
        ({"service": {"backoff_initial_s": 5.0, "backoff_max_s": 1.0}}, "service.backoff_max_s"),
        ({"batch": {"max_messages": 0}}, "batch.max_messages"),
        ({"input": {"max_message_bytes": 0}}, "input.max_message_bytes"),
        ({"input": {"id_field": ""}}, "input.id_field"),
        ({"input": {"content_fields": []}}, "input.content_fields"),
        ({"index": {"path": ""}}, "index.path"),
        ({"output": {"unique_topic": "news unique"}}, "output.unique_topic"),
        ({"dedup": {"num_perm": 0}}, "dedup.num_perm"),
    ],
)
def test_values_out_of_range_name_the_key(layer: dict[str, dict[str, object]], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config([layer])
    assert info.value.key == key


def test_edges_of_the_ranges_are_accepted() -> None:
    config = build_config(
        [
            {
                "http": {"port": 65535},
                "service": {"backoff_initial_s": 2, "backoff_max_s": 2},
                "output": {"dlq_topic": "news.dead-letters_v2"},
            }
        ]
    )
    assert config.http.port == 65535
    assert config.service.backoff_max_s == 2.0 and isinstance(config.service.backoff_max_s, float)
    assert build_config([{"http": {"port": 0}}]).http.port == 0


def _kafka_file(tmp_path: Path, settings: str) -> Path:
    path = tmp_path / "kafka.toml"
    path.write_text(f'[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n{settings}\n')
    return path


@pytest.mark.parametrize(
    ("settings", "key", "words"),
    [
        ('"sesion.timeout.ms" = "6000"', "kafka.sesion.timeout.ms", "no such setting"),
        ('"consumer.fetch.wait.maxms" = 10', "kafka.consumer.fetch.wait.maxms", "no such"),
        ('"producer.lingerms" = 5', "kafka.producer.lingerms", "no such setting"),
        ('"session.timeout.ms" = "soon"', "kafka.session.timeout.ms", "Invalid value"),
        ('"linger.ms" = -5', "kafka.linger.ms", "outside allowed range"),
        ('"security.protocol" = "SASL_SSL"', "kafka.sasl.mechanism", "SCRAM-SHA-512"),
    ],
)
def test_librdkafka_checks_the_kafka_table_at_load(
    tmp_path: Path, settings: str, key: str, words: str
) -> None:
    """librdkafka itself rejects the key or value; the error names the key as written."""
    with pytest.raises(ConfigError) as info:
        load_config(_kafka_file(tmp_path, settings), environ={})
    assert info.value.key == key
    assert words in info.value.problem
    assert "\n" not in str(info.value)


def test_a_valid_kafka_table_loads_without_waiting_for_the_network(tmp_path: Path) -> None:
    """Nothing listens at the bootstrap address: the check makes and closes the clients only."""
    settings = '"session.timeout.ms" = 6000\n"linger.ms" = 5\n"enable.idempotence" = true'
    started = time.monotonic()
    config = load_config(_kafka_file(tmp_path, settings), environ={})
    assert time.monotonic() - started < 2.0
    assert config.kafka["session.timeout.ms"] == "6000"
    assert config.kafka["enable.idempotence"] == "true"


def test_reconnect_backoff_defaults_can_be_overridden() -> None:
    for role in ("consumer", "producer"):
        ours = client_config(role, {})
        assert (ours["reconnect.backoff.ms"], ours["reconnect.backoff.max.ms"]) == ("1000", "10000")
        theirs = client_config(role, {"reconnect.backoff.ms": "50"})
        assert theirs["reconnect.backoff.ms"] == "50"


def test_exactly_once_gives_the_producer_a_transactional_id_from_the_group() -> None:
    config = build_config(
        [{"service": {"delivery": "exactly-once"}, "kafka": {"group.id": "news-dedup"}}]
    )
    assert config.exactly_once
    settings = config.client_settings()
    producer = client_config("producer", settings)
    assert producer["transactional.id"] == "stream-dedup-news-dedup"
    assert "transactional.id" not in client_config("consumer", settings)
    # librdkafka takes transaction.timeout.ms for it; our 300 s default would be refused.
    assert "message.timeout.ms" not in producer
    given = build_config(
        [{"service": {"delivery": "exactly-once"}, "kafka": {"transactional.id": "dedup-a"}}]
    )
    assert client_config("producer", given.client_settings())["transactional.id"] == "dedup-a"
    timed = {"transactional.id": "t", "message.timeout.ms": "20000"}
    assert client_config("producer", timed)["message.timeout.ms"] == "20000"


def test_exactly_once_on_the_shared_index_names_each_instance_transactional_id() -> None:
    """Many instances serve one group on Redis: one transactional.id each, never the group's
    alone (they would fence each other in turn)."""
    eos = {"delivery": "exactly-once"}
    redis = {"backend": "redis"}
    with pytest.raises(ConfigError, match=r"kafka\.group\.instance\.id.*stable id per instance"):
        build_config([{"service": eos, "index": redis, "kafka": {"group.id": "news"}}])
    kafka = {"group.id": "news", "group.instance.id": "pod-1"}
    config = build_config([{"service": eos, "index": redis, "kafka": kafka}])
    settings = config.client_settings()
    assert client_config("producer", settings)["transactional.id"] == "stream-dedup-news-pod-1"
    assert client_config("consumer", settings)["group.instance.id"] == "pod-1"
    given = {"group.id": "news", "transactional.id": "dedup-pod-2"}
    config = build_config([{"service": eos, "index": redis, "kafka": given}])
    assert client_config("producer", config.client_settings())["transactional.id"] == "dedup-pod-2"
    # the owned index keeps the group's id; at-least-once on Redis needs none
    assert (
        build_config([{"service": eos, "kafka": kafka}]).client_settings()[
            "producer.transactional.id"
        ]
        == "stream-dedup-news"
    )
    assert not build_config([{"index": redis, "kafka": {"group.id": "news"}}]).exactly_once


def test_delivery_takes_the_two_modes_only_and_a_transactional_id_needs_exactly_once() -> None:
    assert not ServiceConfig().exactly_once
    assert "transactional.id" not in client_config("producer", ServiceConfig().client_settings())
    with pytest.raises(ConfigError, match=r"service\.delivery.*'at-least-once', 'exactly-once'"):
        build_config([{"service": {"delivery": "exactly_once"}}])
    config = build_config([{"kafka": {"producer.transactional.id": "t"}}])
    with pytest.raises(ConfigError, match=r'kafka\.producer\.transactional\.id.*"exactly-once"'):
        config.client_settings()


def test_config_load_checks_the_transactional_producer(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    eos = '[service]\ndelivery = "exactly-once"\n'
    path.write_text(eos + '[kafka]\n"transaction.timeout.ms" = "x"\n')
    with pytest.raises(ConfigError, match=r"transaction\.timeout\.ms"):
        load_config(path, environ={})
    path.write_text('[kafka]\n"transactional.id" = "t"\n')
    with pytest.raises(ConfigError, match=r"kafka\.transactional\.id"):
        load_config(path, environ={})


def test_the_redis_index_settings_layer_through_file_environment_and_flags(
    tmp_path: Path,
) -> None:
    """``[index.redis]`` is a nested table: the file sets some keys, the environment and
    flags others, and each keeps the rest."""
    path = tmp_path / "c.toml"
    path.write_text(
        '[index]\nbackend = "redis"\n[index.redis]\nnamespace = "news"\nlock_ttl_ms = 5000\n'
    )
    env = {"STREAM_DEDUP_INDEX__REDIS__URL": "rediss://cache:6380/2"}
    config = load_config(
        path, environ=env, overrides=parse_assignments(["index.redis.lock_ttl_ms=700"])
    )
    redis = config.index.redis
    assert config.index.backend == "redis"
    assert (redis.url, redis.namespace, redis.lock_ttl_ms, redis.password) == (
        "rediss://cache:6380/2",
        "news",
        700,
        "",
    )
    assert load_config(None, environ={}).index.backend == "rocksdb"


@pytest.mark.parametrize(
    ("layer", "key", "problem"),
    [
        ({"index": {"backend": "postgres"}}, "index.backend", "rocksdb"),
        ({"index": {"redis": {"url": "http://cache"}}}, "index.redis.url", "redis://"),
        ({"index": {"redis": {"namespace": "a b"}}}, "index.redis.namespace", "A-Z"),
        ({"index": {"redis": {"lock_ttl_ms": 10}}}, "index.redis.lock_ttl_ms", "at least"),
        ({"index": {"redis": {"order_tick_ms": 0}}}, "index.redis.order_tick_ms", "between 1"),
        ({"index": {"redis": {"ur": "redis://x"}}}, "index.redis.ur", "did you mean 'url'"),
        (
            {"index": {"backend": "redis"}, "service": {"delivery": "exactly-once"}},
            "kafka.group.instance.id",
            "stable id per instance",
        ),
    ],
)
def test_bad_redis_index_settings_name_the_key(
    layer: dict[str, dict[str, object]], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config([layer])
    assert caught.value.key == key
    assert problem in caught.value.problem
