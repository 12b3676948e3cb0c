"""Configuration of the Kafka service: its frozen sections and their defaults.

Every setting lives in one documented TOML file (``config/stream-dedup.toml`` lists them
all with their defaults); each section here is a frozen dataclass whose fields are the
settings, with their types and defaults, and whose ``__post_init__`` checks ranges and
names the key of a bad value (:class:`ConfigError`). How the file, the environment and
the flags are read and layered into these sections is :mod:`.config_loading`; the
``[kafka]`` table's librdkafka keys are merged and checked in :mod:`.kafka_settings`.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import DocumentFormat, MessageFormat
from stream_dedup.errors import ConfigError
from stream_dedup.index.redis_layout import DEFAULT_NAMESPACE, NAMESPACE
from stream_dedup.index.retention import Retention, parse_duration

if TYPE_CHECKING:
    from stream_dedup.index.opener import Location


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
class RedisConfig:
    """The shared index on Redis (``index.backend = "redis"``): one node or a Redis
    Cluster, recognised from the server. ``url`` is ``redis://host:port/db`` or
    ``rediss://`` for TLS (``tls_ca_file``: the CA to trust, default the system's);
    ``password`` may also be in the URL. ``namespace`` prefixes every key, so several
    indexes can share one Redis. ``lock_ttl_ms`` is how long an instance killed while
    holding the index's lease blocks the others: longer than deciding and storing one
    batch takes. ``outage_limit_s`` is how long an instance, running or starting, waits
    for an unreachable Redis, retrying, before it stops (0: stop at once). ``group_order``
    decides in one time order across the group's instances (``docs/group-order.md``);
    off, each instance orders only its own partitions. ``order_tick_ms`` is the
    resolution at which that order compares the times of records on different
    instances' partitions: records in one tick go instance by instance, then by
    partition. A finer tick orders closer pairs by time and makes instances take more,
    smaller turns (one per tick and instance); the same on every instance.
    ``decide_ahead``: an instance held back by the order decides its next batch
    meanwhile, settling it in the lease when it comes (same verdicts; off: it idles)."""

    url: str = "redis://localhost:6379/0"
    password: str = ""
    namespace: str = DEFAULT_NAMESPACE
    tls_ca_file: str = ""
    lock_ttl_ms: int = 10_000
    outage_limit_s: float = 120.0
    group_order: bool = True
    order_tick_ms: int = 100
    decide_ahead: bool = True

    def __post_init__(self) -> None:
        if not re.fullmatch(r"(redis|rediss|unix)://.+", self.url):
            raise ConfigError("url", "use redis://host:port/db, or rediss:// for TLS")
        if not NAMESPACE.fullmatch(self.namespace):
            raise ConfigError("namespace", "use 1 to 64 of A-Z a-z 0-9 _ . -")
        if self.lock_ttl_ms < 100:
            raise ConfigError("lock_ttl_ms", "must be at least 100")
        if not 0 <= self.outage_limit_s <= 3600:
            raise ConfigError("outage_limit_s", "must be between 0 and 3600 seconds")
        if not 1 <= self.order_tick_ms <= 60_000:
            raise ConfigError("order_tick_ms", "must be between 1 and 60000 milliseconds")


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Where the index lives. ``backend = "rocksdb"`` (default): a directory, ``path``,
    owned by one instance; ``sync`` fsyncs every commit (survives power loss).
    ``backend = "redis"``: Redis (``[index.redis]``), shared by every instance of the
    consumer group (see ``docs/shared-index.md``).

    ``retention`` (a duration: ``"30d"``, ``"12h"``; ``"none"``) and ``max_documents``
    (0: no limit) bound what the index holds, on the documents' time (see
    :mod:`stream_dedup.index.retention`). They are not index parameters: changing them
    needs no re-indexing. ``on_lost`` says what a lost index does at start.
    """

    backend: typing.Literal["rocksdb", "redis"] = "rocksdb"
    path: str = "data/index"
    sync: bool = False
    retention: str = "none"
    max_documents: int = 0
    #: What to do when the index is empty but the group has committed offsets (see
    #: :meth:`stream_dedup.service.lifecycle.BatchLife.assign`): stop ("fail"), decide
    #: again from the earliest retained messages ("rebuild"), or resume from the group's
    #: offsets with the empty index ("continue").
    on_lost: typing.Literal["fail", "rebuild", "continue"] = "fail"
    redis: RedisConfig = field(default_factory=RedisConfig)

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("index.path", "name the index directory")
        self.policy()  # a bad duration or count is a ConfigError now, not at start

    def location(self) -> Location:
        """Where the index is, as :func:`~stream_dedup.index.opener.open_index` takes it."""
        from stream_dedup.index.opener import RedisSettings

        r = self.redis
        if self.backend != "redis":
            return self.path
        return RedisSettings(
            r.url, r.namespace, r.password or None, r.tls_ca_file or None, r.lock_ttl_ms
        )

    def policy(self) -> Retention:
        """The retention these settings ask for."""
        return Retention(parse_duration(self.retention), self.max_documents)


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
    confirmation, stop and broker outage backoff; the interpreter's switch interval (how
    long a check's thread waits for the loop's thread to hand over the interpreter lock,
    :mod:`stream_dedup.service.switching`).

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
    switch_interval_ms: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.switch_interval_ms <= 1000:
            raise ConfigError(
                "service.switch_interval_ms", "must be more than 0 and at most 1000 ms"
            )
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


#: The check process's port unless ``http.check_port`` names another.
DEFAULT_CHECK_PORT = 9401


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The one HTTP port: /metrics, /healthz, /readyz, and the checks (``POST /check``,
    ``POST /check/batch``: :mod:`stream_dedup.service.check_http`) with their limits: a
    request body of at most ``check_max_bytes``, ``k`` at most ``check_max_k`` and a batch
    of at most ``check_max_documents``. ``port = 0`` picks a free one.

    With ``check_process`` (the default) the checks are answered by a helper process on
    ``check_port`` (:mod:`stream_dedup.service.check_process`), started again after a
    crash at most ``check_restarts`` times in ten minutes; without it, on ``port`` by the
    deciding process itself. On RocksDB, ``check_readers`` has that process answer from
    two reader processes that catch up in turn (:mod:`stream_dedup.service.check_readers`):
    off by default, since on a host without idle cores it lengthened the checks' tail.
    With ``port = 0`` the check port left at its default is any free port too."""

    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = 9400
    health_max_age_s: float = 60.0
    check_max_bytes: int = 1_048_576
    check_max_k: int = 100
    check_max_documents: int = 100
    check_process: bool = True
    check_port: int = DEFAULT_CHECK_PORT
    check_restarts: int = 5
    check_readers: bool = False

    def __post_init__(self) -> None:
        if self.port == 0 and self.check_port == DEFAULT_CHECK_PORT:
            # Any free port for the one: any free port for the other (tests, the demo,
            # several instances on a machine), unless the check port is named.
            object.__setattr__(self, "check_port", 0)
        for name in ("port", "check_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(
                    f"http.{name}", f"must be 0-65535 (0: any free port), got {getattr(self, name)}"
                )
        if self.check_restarts < 0:
            raise ConfigError(
                "http.check_restarts", f"must be 0 or more, got {self.check_restarts}"
            )
        if not self.host:
            raise ConfigError("http.host", "name an address to listen on, e.g. 0.0.0.0")
        if self.health_max_age_s <= 0:
            raise ConfigError("http.health_max_age_s", "must be a positive number of seconds")
        for name in ("check_max_bytes", "check_max_k", "check_max_documents"):
            if getattr(self, name) < 1:
                raise ConfigError(f"http.{name}", f"must be at least 1, got {getattr(self, name)}")


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

#: The keys that set the event producer's ``transactional.id``.
_TRANSACTIONAL_IDS = ("transactional.id", "producer.transactional.id")

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

    def __post_init__(self) -> None:
        named = any(self.kafka.get(k) for k in _TRANSACTIONAL_IDS)
        shared = self.index.backend == "redis"
        if self.exactly_once and shared and not named and not self._instance_name():
            raise ConfigError(
                "kafka.group.instance.id",
                'exactly-once delivery with index.backend = "redis" needs a stable id per '
                "instance: set kafka group.instance.id (or transactional.id) to a value of "
                "its own on each instance, kept across restarts (a pod or host name)",
            )

    def _instance_name(self) -> str | None:
        """``group.instance.id``: what names this instance among its group's."""
        for key in ("group.instance.id", "consumer.group.instance.id"):
            if self.kafka.get(key):
                return self.kafka[key]
        return None

    @property
    def exactly_once(self) -> bool:
        return self.service.delivery == "exactly-once"

    def client_settings(self) -> dict[str, str]:
        """The ``[kafka]`` table as the clients get it.

        In exactly-once mode the producer needs a ``transactional.id``: the one given, or
        ``stream-dedup-<group.id>``. It must be stable across restarts (a restarted
        instance fences the one before and aborts its open transaction) and unique to
        the instance; the group is both, since one instance owns a group's index. On the
        shared index many instances serve one group, so the default is
        ``stream-dedup-<group.id>-<group.instance.id>`` (``docs/shared-index.md``).
        """
        table = dict(self.kafka)
        given = [k for k in _TRANSACTIONAL_IDS if k in table]
        if self.exactly_once and not given:
            tid = f"stream-dedup-{table['group.id']}"
            if self.index.backend == "redis":
                tid += f"-{self._instance_name()}"
            table["producer.transactional.id"] = tid
        if given and not self.exactly_once:
            raise ConfigError(
                f"kafka.{given[0]}",
                "a transactional producer is used only with service.delivery = "
                '"exactly-once": set that, or remove the key',
            )
        return table


#: The sections by their name in the file (``[kafka]`` is a plain table of its own).
SECTIONS: dict[str, type[Any]] = {
    "input": InputConfig,
    "output": OutputConfig,
    "dedup": DedupConfig,
    "index": IndexConfig,
    "batch": BatchConfig,
    "service": ServiceSection,
    "http": HttpConfig,
    "log": LogConfig,
}
