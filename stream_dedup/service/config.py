"""Configuration of the Kafka service: frozen sections, loaded file < environment < flags.

Every setting lives in one documented TOML file (``config/stream-dedup.toml`` lists them
all with their defaults). Values are layered in a fixed order so an operator can tell
where one came from:

1. the defaults written here (the same as in the documented file),
2. the TOML file given with ``--config``,
3. environment variables ``STREAM_DEDUP_<SECTION>__<KEY>`` (e.g.
   ``STREAM_DEDUP_INPUT__TOPICS=news,wire``; in the ``kafka`` section underscores become
   dots: ``STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS`` sets ``bootstrap.servers``),
4. command-line flags (``--set section.key=value`` and a few shortcuts).

An unknown section or key, or a value of the wrong type, is a :class:`ConfigError` naming
the key: a typo must fail loudly rather than silently run with a default. The ``[kafka]``
table is not checked here: its dotted librdkafka keys pass through to the client (see
:mod:`stream_dedup.service.kafka` for how they merge with ours).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dedup.core.config import DedupConfig, DocumentFormat
from stream_dedup.decode import MessageFormat
from stream_dedup.errors import ConfigError

ENV_PREFIX = "STREAM_DEDUP_"


@dataclass(frozen=True, slots=True)
class InputConfig:
    """What to consume and how a message becomes a document."""

    topics: tuple[str, ...] = ("news",)
    format: str = "json"
    id_field: str = "id"
    content_fields: tuple[str, ...] = ("title", "text")
    joiner: str = "\n"
    max_message_bytes: int = 1_048_576

    def __post_init__(self) -> None:
        if not self.topics or not all(self.topics):
            raise ConfigError("input.topics", "name at least one input topic")
        if self.format not in ("json", "text"):
            raise ConfigError("input.format", f"must be 'json' or 'text', got {self.format!r}")
        if self.max_message_bytes < 1:
            raise ConfigError("input.max_message_bytes", "must be positive")

    def document_format(self) -> DocumentFormat:
        return DocumentFormat(self.id_field, self.content_fields, self.joiner)

    def message_format(self) -> MessageFormat:
        """How a message becomes a document (see :func:`stream_dedup.decode.decode_messages`)."""
        return MessageFormat(self.document_format(), self.format == "text", self.max_message_bytes)


@dataclass(frozen=True, slots=True)
class OutputConfig:
    """Where events and dead letters go; empty names derive from the first input topic."""

    unique_topic: str = ""
    duplicate_topic: str = ""
    dlq_topic: str = ""
    include_document: bool = True


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Where the RocksDB index lives; ``sync`` fsyncs every commit (survives power loss)."""

    path: str = "data/index"
    sync: bool = False


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """A batch closes when no more messages are fetched, at ``max_messages``, or ``max_wait_ms``.

    The batch never waits for messages that have not arrived (that would add the wait to
    every document at low load); ``max_wait_ms`` bounds how long it keeps taking messages
    that do keep arriving, counted from its first message.
    """

    max_messages: int = 2000
    max_wait_ms: int = 20

    def __post_init__(self) -> None:
        if self.max_messages < 1:
            raise ConfigError("batch.max_messages", "must be positive")
        if self.max_wait_ms < 0:
            raise ConfigError("batch.max_wait_ms", "must not be negative")


@dataclass(frozen=True, slots=True)
class ServiceSection:
    """How the loop runs: the sketch worker; timeouts of delivery confirmation, stop and
    broker outage backoff."""

    sketch_worker: bool = True
    sketch_inline_max: int = 64
    flush_timeout_s: float = 30.0
    shutdown_timeout_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.sketch_inline_max < 0:
            raise ConfigError("service.sketch_inline_max", "must not be negative")


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The one HTTP port: /metrics, /healthz, /readyz. ``port = 0`` picks a free one."""

    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = 9400
    health_max_age_s: float = 60.0


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Structured logs on standard error: ``json`` or ``kv`` (key=value)."""

    level: str = "INFO"
    format: str = "json"

    def __post_init__(self) -> None:
        if self.format not in ("json", "kv"):
            raise ConfigError("log.format", f"must be 'json' or 'kv', got {self.format!r}")
        if self.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError("log.level", f"not a log level: {self.level!r}")


#: Defaults for the librdkafka table; the user's [kafka] keys override them.
KAFKA_DEFAULTS: Mapping[str, str] = {
    "bootstrap.servers": "localhost:9092",
    "group.id": "stream-dedup",
}


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything ``stream-dedup run`` needs."""

    input: InputConfig = field(default_factory=InputConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    service: ServiceSection = field(default_factory=ServiceSection)
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)
    kafka: Mapping[str, str] = field(default_factory=lambda: dict(KAFKA_DEFAULTS))

    @property
    def unique_topic(self) -> str:
        return self.output.unique_topic or f"{self.input.topics[0]}.unique"

    @property
    def duplicate_topic(self) -> str:
        return self.output.duplicate_topic or f"{self.input.topics[0]}.duplicates"

    @property
    def dlq_topic(self) -> str:
        return self.output.dlq_topic or f"{self.input.topics[0]}.dlq"


_SECTIONS: dict[str, type[Any]] = {
    "input": InputConfig,
    "output": OutputConfig,
    "dedup": DedupConfig,
    "index": IndexConfig,
    "batch": BatchConfig,
    "service": ServiceSection,
    "http": HttpConfig,
    "log": LogConfig,
}


def _coerce(key: str, hint: Any, value: Any) -> Any:
    """``value`` as the field's type; strings (env, flags) are parsed, others type-checked."""
    if typing.get_origin(hint) is typing.Literal:  # a choice: checked by the section itself
        hint = type(typing.get_args(hint)[0])
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(hint) is tuple:
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    expected = getattr(hint, "__name__", str(hint))
    raise ConfigError(key, f"expected {expected}, got {value!r} ({type(value).__name__})")


def _build_section(name: str, values: Mapping[str, Any]) -> Any:
    cls = _SECTIONS[name]
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"{name}.{key}", f"unknown setting; known: {', '.join(sorted(known))}"
            )
        kwargs[key] = _coerce(f"{name}.{key}", hints[key], value)
    return cls(**kwargs)


def _merge(layers: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            if section != "kafka" and section not in _SECTIONS:
                raise ConfigError(section, f"unknown section; known: kafka, {', '.join(_SECTIONS)}")
            if not isinstance(values, dict):
                raise ConfigError(section, "must be a table of settings")
            merged.setdefault(section, {}).update(values)
    return merged


def read_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The TOML file's tables (not yet validated)."""
    try:
        with Path(path).open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(section, "top-level keys must be [tables]")
    return data


def read_env(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Settings from ``STREAM_DEDUP_<SECTION>__<KEY>`` variables."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        if "__" not in rest:
            raise ConfigError(name, "environment overrides are STREAM_DEDUP_<SECTION>__<KEY>")
        section, key = rest.split("__", 1)
        section, key = section.lower(), key.lower()
        if section == "kafka":
            key = key.replace("_", ".")
        out.setdefault(section, {})[key] = value
    return out


def parse_assignments(items: list[str]) -> dict[str, dict[str, Any]]:
    """Settings from ``--set section.key=value`` flags (kafka keys keep their dots)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(item, "use --set section.key=value, e.g. --set batch.max_wait_ms=50")
        out.setdefault(section, {})[key] = value
    return out


def build_config(layers: list[dict[str, dict[str, Any]]]) -> ServiceConfig:
    """Validate merged layers (lowest precedence first) into a :class:`ServiceConfig`."""
    merged = _merge(layers)
    kafka = dict(KAFKA_DEFAULTS)
    for key, value in merged.pop("kafka", {}).items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int | float):
            raise ConfigError(f"kafka.{key}", f"must be a string or number, got {value!r}")
        kafka[key] = str(value)
    sections = {name: _build_section(name, merged.get(name, {})) for name in _SECTIONS}
    config = ServiceConfig(kafka=kafka, **sections)
    return config


def load_config(
    path: str | Path | None,
    environ: Mapping[str, str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> ServiceConfig:
    """File < environment < flags, validated."""
    layers = [read_file(path) if path is not None else {}]
    layers.append(read_env(os.environ if environ is None else environ))
    layers.append(overrides or {})
    return build_config(layers)
