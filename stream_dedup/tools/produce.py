"""JSON Lines -> a Kafka topic, keyed by document id: loading samples and backfills.

Lines are sent as they are (the service decodes them); the key is the line's id when the
line parses as a JSON object with one, else no key, so a malformed line still reaches the
topic and, from there, the dead-letter topic with its reason: nothing is filtered here.

Nothing waits without bound: before the first line the broker must answer a metadata
request within ``probe_timeout_s`` (else nothing is sent), and each line must be delivered
within ``message.timeout.ms`` (30 s unless the configuration says otherwise), so a broker
that is down, or goes away midway, fails the command with a message instead of a hang.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from stream_dedup.errors import StreamDedupError
from stream_dedup.service.broker_watch import BrokerWatch, LibrdkafkaLog
from stream_dedup.service.kafka_settings import client_config, python_client_keys

log = logging.getLogger("stream_dedup.tools.produce")

#: How long a line may wait for its delivery unless ``[kafka]`` sets ``message.timeout.ms``
#: (the service's producer waits librdkafka's 5 minutes: it retries failed events itself).
MESSAGE_TIMEOUT_MS = 30_000


class ProduceError(StreamDedupError):
    """Some lines could not be delivered to the topic."""


def _key(line: bytes, id_field: str) -> bytes | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get(id_field), str | int):
        return str(obj[id_field]).encode()
    return None


def _producer_config(kafka: Mapping[str, str]) -> dict[str, Any]:
    """The producer's settings, with a delivery timeout of :data:`MESSAGE_TIMEOUT_MS` unless
    the user chose one (``message.timeout.ms`` or its alias ``delivery.timeout.ms``)."""
    conf: dict[str, Any] = client_config("producer", kafka)
    chosen = [
        k
        for k in kafka
        if k.removeprefix("producer.") in ("message.timeout.ms", "delivery.timeout.ms")
    ]
    if chosen:
        conf["message.timeout.ms"] = conf.pop(chosen[-1].removeprefix("producer."))
    else:
        conf["message.timeout.ms"] = str(MESSAGE_TIMEOUT_MS)
    conf.pop("delivery.timeout.ms", None)
    return python_client_keys(conf)


def _probe(producer: Producer, bootstrap: str, topic: str, timeout_s: float) -> None:
    """Raise :class:`ProduceError` unless a broker answers for ``topic`` within ``timeout_s``."""
    try:
        metadata = producer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        detail = err.str() if isinstance(err, KafkaError) else str(err)
        raise ProduceError(
            f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s ({detail}); "
            "nothing was sent. Check that a broker is running there and reachable from "
            "this host, or name the right one with --bootstrap-servers HOST:PORT "
            "(or kafka.bootstrap.servers in --config)"
        ) from None
    found = metadata.topics.get(topic)
    error = found.error if found is not None else None
    if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        raise ProduceError(
            f"topic {topic!r} does not exist at {bootstrap}, and the broker does not "
            "create topics on first use; nothing was sent. Create it first (e.g. "
            f"kafka-topics.sh --create --topic {topic} --bootstrap-server {bootstrap})"
        )


def produce_lines(
    lines: Iterable[bytes],
    topic: str,
    kafka: Mapping[str, str],
    *,
    id_field: str = "id",
    progress: Callable[[int], None] | None = None,
    probe_timeout_s: float = 10.0,
) -> int:
    """Produce every non-blank line to ``topic``; returns how many were confirmed.

    Raises :class:`ProduceError` if no broker answers within ``probe_timeout_s`` (before
    anything is sent), or as soon as a line's delivery fails (each waits at most
    ``message.timeout.ms``); the message names the bootstrap address and what to check.
    """
    conf = _producer_config(kafka)
    bootstrap = str(conf.get("bootstrap.servers", ""))
    watch = BrokerWatch("producer")
    watch.bind(conf)
    conf["error_cb"] = watch
    conf["logger"] = LibrdkafkaLog(log)
    producer = Producer(conf)
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err.str())

    def failed(sent: int, undelivered: int, first: str) -> ProduceError:
        producer.purge()  # nothing left queued to wait for at exit
        return ProduceError(
            f"{undelivered} of {sent} lines were not delivered to {topic!r} at {bootstrap} "
            f"(first error: {first}); check that the broker is up and reachable from "
            "this host and that the topic exists"
        )

    _probe(producer, bootstrap, topic, probe_timeout_s)
    timeout_s = float(conf["message.timeout.ms"]) / 1000.0
    sent = 0
    for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        while True:
            try:
                producer.produce(topic, line, key=_key(line, id_field), on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: wait for deliveries (or failures)
                producer.poll(0.1)
                if failures:
                    raise failed(sent, len(producer) + len(failures), failures[0]) from None
        producer.poll(0)
        if failures:
            raise failed(sent + 1, len(producer) + len(failures), failures[0])
        sent += 1
        if progress is not None and sent % 1000 == 0:
            progress(sent)
    # Every line is delivered or failed within message.timeout.ms: wait a little longer.
    remaining = producer.flush(timeout_s + 5.0)
    if remaining or failures:
        raise failed(sent, remaining + len(failures), failures[0] if failures else "timed out")
    watch.alive()
    return sent
