"""Kafka client settings: our defaults, the user's ``[kafka]`` table, what we enforce.

Client settings are merged in a fixed order, later wins::

    our defaults  <  the user's [kafka] table  <  what the commit protocol needs

The enforced keys are :data:`CONSUMER_ENFORCED` and :data:`PRODUCER_ENFORCED`: offsets are
committed only by the checkpoint (never automatically), end-of-partition events tell the
time-ordered merge that a partition is caught up, and an event counts as delivered only
when every in-sync replica has it. In the user's table a ``consumer.`` or
``producer.`` prefix limits a key to one client; keys that only make sense for one role
(``group.id``, ``linger.ms``...) go only to that one. Security settings
(``security.protocol``, ``sasl.*``, ``ssl.*``) pass through unchanged to both, so SASL and
TLS need configuration only. :func:`check_client_config` has librdkafka check the
settings without connecting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from stream_dedup.errors import ConfigError

#: Reconnect backoff of both clients. librdkafka's 100 ms start retries a broker that is
#: down 10-20 times a second (a consumer asks for its group coordinator besides); 1 s makes
#: that one or two. It adds at most a second to a reconnect after a broker restart. The
#: wait doubles per failed attempt up to the maximum (librdkafka's own 10 s, stated).
CONNECTION_DEFAULTS: Mapping[str, str] = {
    "reconnect.backoff.ms": "1000",
    "reconnect.backoff.max.ms": "10000",
}
CONSUMER_DEFAULTS: Mapping[str, str] = {
    **CONNECTION_DEFAULTS,
    # A group with no stored offsets starts at the oldest message: nothing goes undecided.
    "auto.offset.reset": "earliest",
    # Feeds the consumer-lag metric; dropped when no statistics callback is given.
    "statistics.interval.ms": "5000",
    # How long the broker may hold a fetch that finds no data (librdkafka: 500). Apache
    # Kafka answers as soon as fetch.min.bytes (1) has arrived, so there this costs no
    # latency, only up to 20 empty fetches/s per broker while idle. A broker that polls
    # its log instead (Tansu re-reads on a timer within the wait) adds up to this much
    # to a message; 50 ms bounds that. The embedded broker's clients go lower still
    # (stream_dedup.tools.broker.TANSU_CONSUMER_SETTINGS).
    "fetch.wait.max.ms": "50",
    # A backlog arrives in few large fetches, so batches fill up to batch.max_messages.
    "max.partition.fetch.bytes": "8388608",
}
CONSUMER_ENFORCED: Mapping[str, str] = {
    # The time-ordered merge learns from these events that a partition with nothing
    # buffered is at its end and need not be waited for (stream_dedup.service.ordering).
    "enable.partition.eof": "true",
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
}
PRODUCER_DEFAULTS: Mapping[str, str] = {
    **CONNECTION_DEFAULTS,
    # Lets a batch's events share produce requests. It adds no latency to a batch: the
    # checkpoint's flush() sends what is queued at once, whatever linger.ms says.
    "linger.ms": "2",
    # librdkafka's own default, stated because confirm() relies on a delivery that cannot
    # be made being reported as failed (then produced again), not retried forever.
    "message.timeout.ms": "300000",
}
PRODUCER_ENFORCED: Mapping[str, str] = {
    "acks": "all",
}

#: Keys (or key prefixes ending in '.') that belong to one client role only.
_CONSUMER_ONLY = (
    "group.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "auto.offset.reset",
    "enable.auto.",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "max.poll.interval.ms",
    "fetch.",
    "max.partition.fetch.bytes",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "queued.",
    "coordinator.query.interval.ms",
)
_PRODUCER_ONLY = (
    "linger.ms",
    "queue.buffering.",
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "compression.",
    "batch.",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "message.send.max.retries",
    "retries",
    "transactional.id",
    "transaction.timeout.ms",
    "partitioner",
    "sticky.partitioning.linger.ms",
)


def _belongs(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in prefixes)


def client_config(role: str, user: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka settings for ``role`` ('consumer' or 'producer'), merged in order."""
    defaults, enforced, foreign = (
        (CONSUMER_DEFAULTS, CONSUMER_ENFORCED, _PRODUCER_ONLY)
        if role == "consumer"
        else (PRODUCER_DEFAULTS, PRODUCER_ENFORCED, _CONSUMER_ONLY)
    )
    other = "producer." if role == "consumer" else "consumer."
    merged = dict(defaults)
    for key, value in user.items():
        if key.startswith(other) or _belongs(key, foreign):
            continue
        merged[key.removeprefix(f"{role}.")] = value
    if "transactional.id" in merged and not any(
        k.removeprefix("producer.") in ("message.timeout.ms", "delivery.timeout.ms") for k in user
    ):
        # librdkafka wants message.timeout.ms <= transaction.timeout.ms (60 s by default)
        # and, left unset, takes the latter: a delivery cannot outlive its transaction.
        del merged["message.timeout.ms"]
    merged.update(enforced)
    return merged


def python_client_keys(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with the keys the Python client reads itself given the type it wants.

    confluent_kafka takes ``delivery.report.only.error`` only as a bool, while a
    configuration's values are strings: "true"/"1" become True, anything else False.
    """
    if "delivery.report.only.error" in conf:
        value = str(conf["delivery.report.only.error"]).strip().lower()
        conf["delivery.report.only.error"] = value in ("true", "1")
    return conf


class _Discard:
    """A ``logger`` for clients made only to check settings: their lines say nothing new."""

    def log(self, level: int, fmt: str, *args: object) -> None:
        return None


#: The name librdkafka reports for a setting -> the other names it is also set by.
_ALIASES: Mapping[str, tuple[str, ...]] = {
    "queue.buffering.max.ms": ("linger.ms",),
    "request.required.acks": ("acks",),
    "message.send.max.retries": ("retries",),
    "message.timeout.ms": ("delivery.timeout.ms",),
    "metadata.broker.list": ("bootstrap.servers",),
    "max.in.flight.requests.per.connection": ("max.in.flight",),
    "compression.codec": ("compression.type",),
    "sasl.mechanisms": ("sasl.mechanism",),
}


def _kafka_config_error(role: str, user: Mapping[str, str], problem: str) -> ConfigError:
    """A rejected setting as a :class:`ConfigError` naming the user's own key, if found."""
    problem = " ".join(problem.split())  # librdkafka's messages may end in a newline
    quoted = re.search(r'["`]([A-Za-z0-9_.\-]+)["`]', problem)
    names: tuple[str, ...] = ()
    if quoted:
        names = (quoted.group(1), *_ALIASES.get(quoted.group(1), ()))
    elif "SASL mechanism" in problem:
        # Often none was set: librdkafka's default, GSSAPI (Kerberos), is seldom built in.
        names = ("sasl.mechanism", "sasl.mechanisms")
        if not any(k.removeprefix(f"{role}.") in names for k in user):
            return ConfigError(
                "kafka.sasl.mechanism",
                f"not set, and librdkafka's default does not work here ({problem}); "
                "set it to the broker's: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
            )
    key = next(
        (
            k
            for k in user
            if k in names or (k.startswith(f"{role}.") and k[len(role) + 1 :] in names)
        ),
        None,
    )
    if "No such configuration property" in problem:
        what = (
            "librdkafka has no such setting: check its spelling against librdkafka's "
            "CONFIGURATION.md (a key for one client only takes a consumer. or producer. "
            "prefix)"
        )
    else:
        what = f"librdkafka rejects it for the {role}: {problem}"
    if key is None:
        return ConfigError("kafka", what if quoted is None else f"{quoted.group(1)}: {what}")
    return ConfigError(f"kafka.{key}", what)


def check_client_config(user: Mapping[str, str]) -> None:
    """Have librdkafka check the ``[kafka]`` settings as each client will get them.

    Each client is made with the merged settings of :func:`client_config` and closed at
    once. librdkafka checks every key and value when a client is made (an unknown key is
    "No such configuration property"), so a typo fails at start, not as a traceback when
    ``run`` makes its clients after loading the index. Nothing waits for the network.
    Raises :class:`ConfigError` naming the offending key.
    """
    for role in ("consumer", "producer"):
        conf: dict[str, Any] = python_client_keys(client_config(role, user))
        conf["logger"] = _Discard()
        try:
            client: Consumer | Producer = Consumer(conf) if role == "consumer" else Producer(conf)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            text = err.str() if isinstance(err, KafkaError) else str(exc)
            raise _kafka_config_error(role, user, text) from None
        except (TypeError, ValueError) as exc:  # a key the Python client reads itself
            raise _kafka_config_error(role, user, str(exc)) from None
        client.close()
