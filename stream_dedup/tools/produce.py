"""JSON Lines -> a Kafka topic, keyed by document id: loading samples and backfills.

Lines are sent as they are (the service decodes them); the key is the line's id when the
line parses as a JSON object with one, else no key, so a malformed line still reaches the
topic and, from there, the dead-letter topic with its reason: nothing is filtered here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import KafkaError, Message, Producer

from stream_dedup.errors import StreamDedupError
from stream_dedup.service.kafka import client_config

log = logging.getLogger("stream_dedup.tools.produce")


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


def produce_lines(
    lines: Iterable[bytes],
    topic: str,
    kafka: Mapping[str, str],
    *,
    id_field: str = "id",
    progress: Callable[[int], None] | None = None,
    timeout_s: float = 60.0,
) -> int:
    """Produce every non-blank line to ``topic``; returns how many were confirmed."""
    producer = Producer(client_config("producer", kafka), logger=log)
    failures: list[str] = []
    sent = 0

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(str(err))

    for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        while True:
            try:
                producer.produce(topic, line, key=_key(line, id_field), on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
        if progress is not None and sent % 1000 == 0:
            progress(sent)
    remaining = producer.flush(timeout_s)
    if remaining or failures:
        raise ProduceError(
            f"{remaining + len(failures)} of {sent} lines were not delivered to {topic!r}"
            f" (first error: {failures[0] if failures else 'flush timed out'}); "
            "check that the broker is reachable and the topic exists"
        )
    return sent
