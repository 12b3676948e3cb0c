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

An unknown section or key, a value of the wrong type or out of range is a
:class:`ConfigError` naming the key: a typo must fail loudly rather than silently run with
a default. Types come from the sections' dataclass fields. A value in the TOML file must
already have its setting's type (``max_messages = "2000"`` is a string, an error: the
quotes are a mistake worth pointing out); environment variables and flags can only be
strings, so theirs are parsed (``STREAM_DEDUP_BATCH__MAX_MESSAGES=2000``). The ``[kafka]``
table's dotted librdkafka keys pass through to the client (see
:mod:`stream_dedup.service.kafka_settings` for how they merge with ours); :func:`load_config` has
librdkafka itself check them, so a misspelt key fails here and not when ``run`` connects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import DocumentFormat, MessageFormat
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
    #: The JSON field holding a document's time (epoch ms or ISO-8601); "" = the message
    #: timestamp. Documents are decided in this time across partitions.
    time_field: str = ""

    def __post_init__(self) -> None:
        if not self.topics or not all(self.topics):
            raise ConfigError("input.topics", "name at least one input topic")
        if self.format not in ("json", "text"):
            raise ConfigError("input.format", f"must be 'json' or 'text', got {self.format!r}")
        if self.max_message_bytes < 1:
            raise ConfigError("input.max_message_bytes", "must be positive")
        if not self.id_field:
            raise ConfigError("input.id_field", "name the JSON field that holds the id")
        if not self.content_fields or not all(self.content_fields):
            raise ConfigError("input.content_fields", "name at least one JSON field of text")

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

    def __post_init__(self) -> None:
        # Kafka's own rule for topic names: the broker would refuse the first event.
        for name in ("unique_topic", "duplicate_topic", "dlq_topic"):
            topic = getattr(self, name)
            if topic and (not _TOPIC_NAME.fullmatch(topic) or topic in (".", "..")):
                raise ConfigError(
                    f"output.{name}",
                    f"{topic!r} is not a Kafka topic name: use at most 249 of "
                    "a-z A-Z 0-9 . _ - (or leave it empty for the derived name)",
                )


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Where the RocksDB index lives; ``sync`` fsyncs every commit (survives power loss)."""

    path: str = "data/index"
    sync: bool = False

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("index.path", "name the index directory")


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """A batch closes when no more messages are fetched, at ``max_messages``, or ``max_wait_ms``.

    The batch never waits for messages that have not arrived (that would add the wait to
    every document at low load); ``max_wait_ms`` bounds how long it keeps taking messages
    that do keep arriving, counted from its first message.
    """

    max_messages: int = 2000
    max_wait_ms: int = 20
    #: How long an assigned partition with nothing buffered, not known to be at its end,
    #: may hold back the time-ordered merge of the others (Kafka Streams' max.task.idle.ms).
    max_idle_ms: int = 500

    def __post_init__(self) -> None:
        if self.max_idle_ms < 0:
            raise ConfigError("batch.max_idle_ms", "must not be negative")
        if self.max_messages < 1:
            raise ConfigError("batch.max_messages", "must be positive")
        if self.max_wait_ms < 0:
            raise ConfigError("batch.max_wait_ms", "must not be negative")


@dataclass(frozen=True, slots=True)
class ServiceSection:
    """How the loop runs: the delivery guarantee; the sketch worker; timeouts of delivery
    confirmation, stop and broker outage backoff.

    ``delivery`` is ``"at-least-once"`` (a crash may emit one batch's events twice,
    identical) or ``"exactly-once"`` (events, dead letters and input offsets in one Kafka
    transaction: a ``read_committed`` reader sees each event once; see
    :mod:`stream_dedup.service.checkpoint`).
    """

    delivery: typing.Literal["at-least-once", "exactly-once"] = "at-least-once"
    sketch_worker: bool = True
    sketch_inline_max: int = 64
    flush_timeout_s: float = 30.0
    shutdown_timeout_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.sketch_inline_max < 0:
            raise ConfigError("service.sketch_inline_max", "must not be negative")
        for name in ("flush_timeout_s", "shutdown_timeout_s", "backoff_initial_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"service.{name}", "must be a positive number of seconds")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError(
                "service.backoff_max_s",
                f"must be at least backoff_initial_s ({self.backoff_initial_s})",
            )


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The one HTTP port: /metrics, /healthz, /readyz. ``port = 0`` picks a free one."""

    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = 9400
    health_max_age_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("http.port", f"must be 0-65535 (0: any free port), got {self.port}")
        if not self.host:
            raise ConfigError("http.host", "name an address to listen on, e.g. 0.0.0.0")
        if self.health_max_age_s <= 0:
            raise ConfigError("http.health_max_age_s", "must be a positive number of seconds")


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


#: Legal Kafka topic names (the broker's rule).
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")

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

    @property
    def exactly_once(self) -> bool:
        return self.service.delivery == "exactly-once"

    def client_settings(self) -> dict[str, str]:
        """The ``[kafka]`` table as the clients get it.

        In exactly-once mode the producer needs a ``transactional.id``: the one given, or
        ``stream-dedup-<group.id>``. It must be stable across restarts (a restarted
        instance fences the one before and aborts its open transaction) and unique to
        the instance; the group is both, since one instance owns a group's index.
        """
        table = dict(self.kafka)
        given = [k for k in ("transactional.id", "producer.transactional.id") if k in table]
        if self.exactly_once and not given:
            table["producer.transactional.id"] = f"stream-dedup-{table['group.id']}"
        if given and not self.exactly_once:
            raise ConfigError(
                f"kafka.{given[0]}",
                "a transactional producer is used only with service.delivery = "
                '"exactly-once": set that, or remove the key',
            )
        return table


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


class TextLayer(dict[str, dict[str, Any]]):
    """Settings given as text: environment variables and command-line flags.

    Their values are strings whatever the setting's type, so they are parsed into it
    (``"2000"`` becomes 2000, ``"news,wire"`` a tuple). A TOML file's values are not
    parsed: the file has types, and a string where a number belongs is a mistake there.
    """


#: What a TOML value is, in words, for error messages.
_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a table",
}


def _describe(hint: Any) -> str:
    """The kind of value a setting of type ``hint`` takes, in words."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true or false"
    if hint in _KINDS:
        return _KINDS[hint]
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        return f"a list, each item {_describe(args[0] if args else str)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in hint)
    if dataclasses.is_dataclass(hint):
        return "a table"
    return getattr(hint, "__name__", str(hint))


def _toml(value: Any) -> str:
    """``value`` as it is written in TOML (for suggestions in error messages)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _toml(value.value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _wrong(key: str, hint: Any, value: Any, text: bool) -> ConfigError:
    """The error for a value that is not of its setting's type, with the fix if one is known."""
    kind = _KINDS.get(type(value), type(value).__name__)
    problem = f"expected {_describe(hint)}, got {value!r} ({kind})"
    if not text and isinstance(value, str):
        # A quoted number, flag or list in the file: show how the value is written.
        try:
            meant = _coerce(key, hint, value, text=True)
        except ConfigError:
            pass
        else:
            problem += f"; in TOML write {key.rsplit('.', 1)[-1]} = {_toml(meant)}"
    return ConfigError(key, problem)


def _coerce(key: str, hint: Any, value: Any, *, text: bool) -> Any:
    """``value`` as a setting of type ``hint``, or a :class:`ConfigError` naming ``key``.

    With ``text`` (environment variables, flags) a string is parsed into the type; without
    (a TOML value) the value must already be of the type, except that an integer is taken
    for a float setting (TOML writes 30 and 30.0 for the same number of seconds).
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        blank = isinstance(value, str) and value.strip().lower() in ("", "none")
        if text and type(None) in args and blank:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return _coerce(key, option, value, text=text)
            except ConfigError:
                continue
        raise _wrong(key, hint, value, text)
    if origin is typing.Literal:
        for choice in args:
            if type(choice) is type(value) and choice == value:
                return choice
            if text and isinstance(value, str) and str(choice) == value.strip():
                return choice
        raise ConfigError(key, f"must be {_describe(hint)}, got {value!r}")
    if origin is tuple:
        item = args[0] if args else str
        if text and isinstance(value, str):
            parts = [v.strip() for v in value.split(",") if v.strip()]
            return tuple(_coerce(key, item, v, text=True) for v in parts)
        if isinstance(value, list | tuple):
            return tuple(_coerce(key, item, v, text=text) for v in value)
        raise _wrong(key, hint, value, text)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if value == member.value or value is member or (text and value == member.name):
                return member
        raise ConfigError(key, f"must be {_describe(hint)}, got {value!r}")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, Mapping):
            names = set(value) if text else set()
            return _build_fields(key, hint, value, names)
        raise _wrong(key, hint, value, text)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if text and isinstance(value, str):
            word = value.strip().lower()
            if word in ("true", "1", "yes", "on"):
                return True
            if word in ("false", "0", "no", "off"):
                return False
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text and isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif hint is float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif text and isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value.strip())
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(key, f"must be a finite number, got {value!r}")
            return number
    elif hint is str:
        if isinstance(value, str):
            return value
    elif isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _wrong(key, hint, value, text)


def _build_fields(prefix: str, cls: type[Any], values: Mapping[str, Any], text: set[str]) -> Any:
    """An instance of the dataclass ``cls`` from ``values``, each checked against its field.

    ``text`` names the keys whose values are strings to parse (see :class:`TextLayer`).
    Unknown keys are errors; a :class:`ConfigError` the class raises about one of its own
    fields is re-raised naming the key as the configuration spells it (``dedup.threshold``).
    """
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{prefix}.{key}", f"unknown setting; {hint}known: {', '.join(sorted(known))}"
            )
        kwargs[key] = _coerce(f"{prefix}.{key}", hints[key], value, text=key in text)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.key in known:
            raise ConfigError(f"{prefix}.{exc.key}", exc.problem) from exc
        raise


def _build_section(name: str, values: Mapping[str, Any], text: set[str] | None = None) -> Any:
    """Section ``name`` from its merged values; ``text`` names the keys given as text."""
    return _build_fields(name, _SECTIONS[name], values, text or set())


def _merge(
    layers: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, dict[str, Any]], set[tuple[str, str]]]:
    """The layers merged, later wins, and which (section, key) pairs hold text to parse."""
    merged: dict[str, dict[str, Any]] = {}
    from_text: set[tuple[str, str]] = set()
    for layer in layers:
        text = isinstance(layer, TextLayer)
        for section, values in layer.items():
            if section != "kafka" and section not in _SECTIONS:
                close = difflib.get_close_matches(section, [*_SECTIONS, "kafka"], n=1)
                hint = f"did you mean [{close[0]}]? " if close else ""
                raise ConfigError(
                    section, f"unknown section; {hint}known: kafka, {', '.join(_SECTIONS)}"
                )
            if not isinstance(values, dict):
                raise ConfigError(section, "must be a table of settings")
            merged.setdefault(section, {}).update(values)
            for key in values:
                if text:
                    from_text.add((section, key))
                else:
                    from_text.discard((section, key))
    return merged, from_text


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


def read_env(environ: Mapping[str, str]) -> TextLayer:
    """Settings from ``STREAM_DEDUP_<SECTION>__<KEY>`` variables (strings, parsed later)."""
    out = TextLayer()
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


def parse_assignments(items: list[str]) -> TextLayer:
    """Settings from ``--set section.key=value`` flags (kafka keys keep their dots)."""
    out = TextLayer()
    for item in items:
        name, sep, value = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(item, "use --set section.key=value, e.g. --set batch.max_wait_ms=50")
        out.setdefault(section, {})[key] = value
    return out


def build_config(layers: Sequence[Mapping[str, Any]]) -> ServiceConfig:
    """Validate merged layers (lowest precedence first) into a :class:`ServiceConfig`.

    The strings of a :class:`TextLayer` are parsed into each setting's type; any other
    layer (a TOML file's tables) must hold values of the right type already.
    """
    merged, from_text = _merge(layers)
    kafka = dict(KAFKA_DEFAULTS)
    for key, value in merged.pop("kafka", {}).items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int | float):
            raise ConfigError(f"kafka.{key}", f"must be a string or number, got {value!r}")
        kafka[key] = str(value)
    sections = {
        name: _build_section(name, merged.get(name, {}), {key for s, key in from_text if s == name})
        for name in _SECTIONS
    }
    return ServiceConfig(kafka=kafka, **sections)


def load_config(
    path: str | Path | None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> ServiceConfig:
    """File < environment < flags (``overrides``, parsed as text), validated.

    The ``[kafka]`` settings are checked by librdkafka itself (see
    :func:`stream_dedup.service.kafka_settings.check_client_config`), so that ``config check``
    rejects what ``run`` would die on, and ``run`` stops before opening the index.
    """
    # Imported here: the Kafka client is not loaded by modules that only read settings.
    from stream_dedup.service.kafka_settings import check_client_config

    layers: list[Mapping[str, Any]] = [read_file(path) if path is not None else {}]
    layers.append(read_env(os.environ if environ is None else environ))
    flags = TextLayer()
    for section, values in (overrides or {}).items():
        flags[section] = dict(values)
    layers.append(flags)
    config = build_config(layers)
    check_client_config(config.client_settings())
    return config
