"""The Kafka edge: client configuration, consumer construction, a confirming producer.

Nothing here knows about the index or about verdicts. Client settings are merged in a fixed
order, later wins::

    our defaults  <  the user's [kafka] table  <  what the commit protocol needs

The enforced keys are :data:`CONSUMER_ENFORCED` and :data:`PRODUCER_ENFORCED`: offsets are
committed only by the checkpoint (never automatically), and an event counts as delivered
only when every in-sync replica has it. In the user's table a ``consumer.`` or
``producer.`` prefix limits a key to one client; keys that only make sense for one role
(``group.id``, ``linger.ms``...) go only to that one. Security settings
(``security.protocol``, ``sasl.*``, ``ssl.*``) pass through unchanged to both, so SASL and
TLS need configuration only.

Constructors open no connection; librdkafka connects in the background and reconnects on
its own with backoff. :class:`BrokerWatch` logs outages once, not once per retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from stream_dedup.errors import StreamDedupError
from stream_dedup.service.events import OutRecord

log = logging.getLogger("stream_dedup.service.kafka")

#: What a delivery report tells of its record: topic, key and value (not the headers).
_Identity = tuple[str, bytes | None, bytes | None]

CONSUMER_DEFAULTS: Mapping[str, str] = {
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
    # The loop has no use for end-of-partition events.
    "enable.partition.eof": "false",
}
CONSUMER_ENFORCED: Mapping[str, str] = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
}
PRODUCER_DEFAULTS: Mapping[str, str] = {
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
    merged.update(enforced)
    return merged


class BrokerWatch:
    """librdkafka ``error_cb``: logs a broker outage when it starts and when it ends.

    librdkafka keeps reconnecting by itself (``reconnect.backoff.ms`` up to
    ``reconnect.backoff.max.ms``); the loop just keeps polling. A fatal error is remembered
    for the loop to raise, because nothing can recover it in-process.
    """

    def __init__(self, client: str, repeat_s: float = 30.0) -> None:
        self.client = client
        self.down_since: float | None = None
        self.fatal: KafkaError | None = None
        self._last_log = 0.0
        self._repeat_s = repeat_s

    def __call__(self, err: KafkaError) -> None:
        now = time.monotonic()
        if err.fatal():
            self.fatal = err
            log.error(
                "fatal Kafka client error",
                extra={"fields": {"client": self.client, "error": err.str(), "action": "restart"}},
            )
            return
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            if self.down_since is None:
                self.down_since = now
            if now - self._last_log >= self._repeat_s:
                self._last_log = now
                log.warning(
                    "broker unreachable, waiting for it (librdkafka reconnects with backoff)",
                    extra={
                        "fields": {
                            "client": self.client,
                            "error": err.str(),
                            "down_s": round(now - self.down_since, 1),
                            "action": "check bootstrap.servers, the network and the brokers",
                        }
                    },
                )
            return
        log.warning(
            "Kafka client error", extra={"fields": {"client": self.client, "error": err.str()}}
        )

    def alive(self) -> None:
        """Called when the client made progress: closes a logged outage."""
        if self.down_since is not None:
            log.info(
                "broker reachable again",
                extra={
                    "fields": {
                        "client": self.client,
                        "down_s": round(time.monotonic() - self.down_since, 1),
                    }
                },
            )
            self.down_since = None
            self._last_log = 0.0


def build_consumer(
    user: Mapping[str, str],
    watch: BrokerWatch,
    stats_cb: Callable[[str], None] | None,
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None] | None = None,
) -> Consumer:
    """A consumer with merged settings; no network until the first poll.

    ``on_commit`` hears how each offset commit ended (asynchronous commits report there).
    """
    conf: dict[str, Any] = client_config("consumer", user)
    conf["error_cb"] = watch
    if on_commit is not None:
        conf["on_commit"] = on_commit
    conf["logger"] = logging.getLogger("stream_dedup.librdkafka.consumer")
    if stats_cb is not None:
        conf["stats_cb"] = stats_cb
    else:
        conf.pop("statistics.interval.ms", None)
    return Consumer(conf)


class DeliveryAbandonedError(StreamDedupError):
    """Deliveries could not be confirmed before the caller gave up (stopping)."""


class EventProducer:
    """Asynchronous produce, then :meth:`confirm`: every record delivered, or wait.

    ``produce`` never blocks on a full local queue for long: on ``BufferError`` it serves
    delivery reports (``poll``) and retries. ``confirm`` flushes and re-produces any record
    whose delivery failed (events are keyed by id and identical on retry, so a duplicate
    delivery is harmless); while the broker is away it waits with exponential backoff and
    logs, instead of failing the batch.
    """

    def __init__(self, user: Mapping[str, str], watch: BrokerWatch) -> None:
        conf: dict[str, Any] = client_config("producer", user)
        conf["error_cb"] = watch
        conf["logger"] = logging.getLogger("stream_dedup.librdkafka.producer")
        # Delivery reports only for failures (unless the user says otherwise), through one
        # producer-wide callback: confirm() needs the failed records, to produce them
        # again, not a Python callback per delivered event (a callback bound to each
        # record cost ~1 us per event); flush() returning 0 says everything else was
        # acknowledged. The Python client reads this one key itself, and only as a bool.
        only_errors = str(conf.get("delivery.report.only.error", "true")).lower()
        conf["delivery.report.only.error"] = only_errors in ("true", "1")
        conf["on_delivery"] = self._report
        self._producer = Producer(conf)
        self._watch = watch
        #: Records produced since the last confirmed flush, to rebuild failed ones from.
        self._inflight: list[OutRecord] = []
        self._failed: list[tuple[_Identity, KafkaError]] = []

    def produce(self, rec: OutRecord) -> None:
        """Queue one record; raises KafkaException if the client rejects it outright.

        Delivery reports are served by :meth:`confirm` (and by ``poll`` when the local
        queue is full), not once per record. Only failures are reported by default
        (``delivery.report.only.error``); a success report is ignored.
        """
        self._send(rec)
        self._inflight.append(rec)

    def _send(self, rec: OutRecord) -> None:
        while True:
            try:
                self._producer.produce(rec.topic, rec.value, rec.key, headers=rec.headers)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _report(self, err: KafkaError | None, msg: Message) -> None:
        # A report's message has no headers: the record is found again by the rest.
        if err is not None:
            self._failed.append(((msg.topic() or "", msg.key(), msg.value()), err))

    def _failed_records(self, failed: list[tuple[_Identity, KafkaError]]) -> list[OutRecord]:
        """The produced records (headers included) that the failure reports name."""
        produced: dict[_Identity, list[OutRecord]] = {}
        for rec in self._inflight:
            produced.setdefault((rec.topic, rec.key, rec.value), []).append(rec)
        records = []
        for identity, _err in failed:
            same = produced.get(identity)
            if not same:  # never: librdkafka reports the bytes it was given
                raise DeliveryAbandonedError(
                    f"a failed delivery to {identity[0]} matches no record produced"
                )
            records.append(same.pop())
        return records

    def confirm(
        self,
        step_s: float,
        backoff: tuple[float, float],
        give_up: Callable[[], bool] = lambda: False,
    ) -> None:
        """Return once every produced record is acknowledged by the broker.

        ``step_s`` is how long one flush waits before the outage is logged; ``backoff`` is
        (initial, maximum) seconds between re-produce attempts of failed records. Raises
        :class:`DeliveryAbandonedError` when ``give_up()`` turns true while records are
        still unconfirmed.
        """
        delay = backoff[0]
        started = time.monotonic()
        while True:
            # 0 once every record is acknowledged or failed (failures are reported first).
            remaining = self._producer.flush(step_s)
            if self._failed:
                failed, self._failed = self._failed, []
                records = self._failed_records(failed)
                log.warning(
                    "event deliveries failed, producing them again",
                    extra={
                        "fields": {
                            "records": len(failed),
                            "error": failed[0][1].str(),
                            "retry_in_s": delay,
                            "action": "check that the output topics exist and the broker is up",
                        }
                    },
                )
                if give_up():
                    raise DeliveryAbandonedError(f"{len(failed)} records failed to deliver")
                time.sleep(delay)
                delay = min(delay * 2, backoff[1])
                for rec in records:
                    self._send(rec)  # still in _inflight: a retry does not add it again
                continue
            if not remaining:
                self._inflight.clear()
                break
            log.warning(
                "waiting for event deliveries",
                extra={
                    "fields": {
                        "outstanding": remaining,
                        "waited_s": round(time.monotonic() - started, 1),
                        "action": "check the broker; the batch commits once all are delivered",
                    }
                },
            )
            if give_up():
                raise DeliveryAbandonedError(f"{remaining} deliveries unconfirmed")
        self._watch.alive()

    def close(self, timeout_s: float) -> int:
        """Flush what is left; returns the number of records still undelivered."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining


def raise_if_fatal(msg: Message) -> KafkaError | None:
    """A consumed message's error: fatal ones raise, others are returned for logging."""
    err: KafkaError | None = msg.error()
    if err is not None and err.fatal():
        raise KafkaException(err)
    return err
