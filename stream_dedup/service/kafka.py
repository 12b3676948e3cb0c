"""The Kafka clients: consumer construction and a producer that confirms every delivery.

Nothing here knows about the index or about verdicts. Settings come from
:mod:`.kafka_settings`; outages are told by :mod:`.broker_watch`. Constructors open no
connection; librdkafka connects in the background and reconnects on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
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
from stream_dedup.logs import LogThrottle, fields
from stream_dedup.service.broker_watch import BrokerWatch, LibrdkafkaLog
from stream_dedup.service.events import OutRecord
from stream_dedup.service.kafka_settings import client_config, python_client_keys
from stream_dedup.service.refusals import Refused, permanent, refusal, refuse_all

log = logging.getLogger("stream_dedup.service.kafka")

#: What a delivery report tells of its record: topic, key and value (not the headers).
_Identity = tuple[str, bytes | None, bytes | None]


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
    watch.bind(conf)
    conf["error_cb"] = watch
    if on_commit is not None:
        conf["on_commit"] = on_commit
    conf["logger"] = LibrdkafkaLog(logging.getLogger("stream_dedup.librdkafka.consumer"))
    if stats_cb is not None:

        def statistics(payload: str) -> None:
            watch.statistics(payload)  # a connected broker ends an outage
            stats_cb(payload)

        conf["stats_cb"] = statistics
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
    logs, instead of failing the batch. A record refused for good (:mod:`.refusals`),
    when produced or in its delivery report, is replaced at once by what the batch's
    :data:`~stream_dedup.service.refusals.Refused` gives (:meth:`begin`).
    """

    def __init__(self, user: Mapping[str, str], watch: BrokerWatch) -> None:
        conf: dict[str, Any] = client_config("producer", user)
        watch.bind(conf)
        conf["error_cb"] = watch
        conf["logger"] = LibrdkafkaLog(logging.getLogger("stream_dedup.librdkafka.producer"))
        # Delivery reports only for failures (unless the user says otherwise), through one
        # producer-wide callback: confirm() needs the failed records, to produce them
        # again, not a Python callback per delivered event (a callback bound to each
        # record is one more Python call per event on the loop's thread); flush()
        # returning 0 says everything else was acknowledged.
        conf.setdefault("delivery.report.only.error", "true")
        python_client_keys(conf)
        conf["on_delivery"] = self._report
        self._producer = Producer(conf)
        self._watch = watch
        #: Records produced since the last confirmed flush, to rebuild failed ones from.
        self._inflight: list[OutRecord] = []
        self._failed: list[tuple[_Identity, KafkaError]] = []
        self._refused: Refused = refuse_all

    def begin(self, refused: Refused | None = None) -> None:
        """A batch's records follow (a transaction begins in the transactional producer);
        ``refused`` replaces those refused for good (by default none can be)."""
        if refused is not None:
            self._refused = refused

    def deliver(
        self,
        offsets: Mapping[tuple[str, int], int],
        group: object,
        step_s: float,
        backoff: tuple[float, float],
        give_up: Callable[[], bool] = lambda: False,
    ) -> None:
        """Return once the batch's records are delivered for good: here, :meth:`confirm`.

        ``offsets`` (the batch's next input offsets) and ``group`` (the consumer's group
        metadata) serve the transactional producer, which commits them with the records.
        """
        self.confirm(step_s, backoff, give_up)

    def produce(self, rec: OutRecord) -> None:
        """Queue one record; raises KafkaException if the client rejects it outright.

        Delivery reports are served by :meth:`confirm` (and by ``poll`` when the local
        queue is full), not once per record. Only failures are reported by default
        (``delivery.report.only.error``); a success report is ignored.
        """
        self._inflight.append(self._send_or_replace(rec))

    def _send_or_replace(self, rec: OutRecord) -> OutRecord:
        """Queue ``rec``, or what replaces it if the client refuses it for good; returns
        the record queued. Other client errors are raised."""
        while True:
            try:
                self._send(rec)
                return rec
            except KafkaException as exc:
                err = refusal(exc)
                if err is None:
                    raise
                rec = self._refused(rec, err)

    def _replace_refused(
        self, failed: list[tuple[OutRecord, KafkaError]]
    ) -> tuple[list[tuple[OutRecord, KafkaError]], list[int]]:
        """Swap each record refused for good in ``failed`` for its replacement among the
        batch's records, unsent; returns the failures left to retry, and where the
        replacements are."""
        retry, replaced = [], []
        for rec, err in failed:
            if not permanent(err):
                retry.append((rec, err))
                continue
            at = next(i for i, r in enumerate(self._inflight) if r is rec)
            self._inflight[at] = self._refused(rec, err)
            replaced.append(at)
        return retry, replaced

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

    def _failed_records(
        self, failed: list[tuple[_Identity, KafkaError]]
    ) -> list[tuple[OutRecord, KafkaError]]:
        """The produced records (headers included) that the failure reports name."""
        produced: dict[_Identity, list[OutRecord]] = {}
        for rec in self._inflight:
            produced.setdefault((rec.topic, rec.key, rec.value), []).append(rec)
        records = []
        for identity, err in failed:
            same = produced.get(identity)
            if not same:  # never: librdkafka reports the bytes it was given
                raise DeliveryAbandonedError(
                    f"a failed delivery to {identity[0]} matches no record produced"
                )
            records.append((same.pop(), err))
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
                if self._retry_failed(delay, give_up):
                    delay = min(delay * 2, backoff[1])
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

    def _retry_failed(self, delay_s: float, give_up: Callable[[], bool]) -> bool:
        """Send the replacements of records refused for good now, and the other failed
        records again after ``delay_s``; returns whether it waited."""
        failed, self._failed = self._failed, []
        retry, replaced = self._replace_refused(self._failed_records(failed))
        for at in replaced:
            self._inflight[at] = self._send_or_replace(self._inflight[at])
        if not retry:
            return False
        log.warning(
            "event deliveries failed, producing them again",
            extra=fields(
                records=len(retry),
                error=retry[0][1].str(),
                retry_in_s=delay_s,
                action="check that the output topics exist and the broker is up",
            ),
        )
        if give_up():
            raise DeliveryAbandonedError(f"{len(retry)} records failed to deliver")
        time.sleep(delay_s)
        for rec, _err in retry:
            self._send(rec)  # still in _inflight: a retry does not add it again
        return True

    def close(self, timeout_s: float) -> int:
        """Flush what is left; returns the number of records still undelivered.

        A producer in a fatal state (fenced by a newer instance, say) fails its flush, and
        confluent-kafka may then report it from inside a delivery callback as a
        ``SystemError``. The service is stopping because of that state already: the error
        is logged rather than raised, so it does not hide the one that stopped the
        service, and what was not delivered is replayed at the next start.
        """
        try:
            remaining: int = self._producer.flush(timeout_s)
        except (KafkaException, SystemError) as exc:
            left = len(self._producer)
            log.warning(
                "the producer could not flush at close",
                extra={"fields": {"error": f"{type(exc).__name__}: {exc}", "records": left}},
            )
            return left
        return remaining


def raise_if_fatal(msg: Message) -> KafkaError | None:
    """A consumed message's error: fatal ones raise, others are returned for logging."""
    err: KafkaError | None = msg.error()
    if err is not None and err.fatal():
        raise KafkaException(err)
    return err


def consumed_records(
    msgs: list[Message], errors: LogThrottle, at_end: Callable[[tuple[str, int], int], None]
) -> Iterator[Message]:
    """The records among consumed messages, in order. A partition's end is told to
    ``at_end`` where it comes among them, with its end offset (the offset of the next
    record to come there); another error is logged, each kind (code,
    partition) once per ``errors``' interval with the count left out (a persisting error
    comes back at every poll); a fatal one raises."""
    for msg in msgs:
        err = raise_if_fatal(msg)
        if err is None:
            yield msg
        elif err.code() == KafkaError._PARTITION_EOF:
            topic, partition = msg.topic(), msg.partition()
            if topic is not None and partition is not None:
                offset = msg.offset()
                at_end((topic, partition), -1 if offset is None else offset)
        else:
            dropped = errors.admit((err.code(), msg.topic(), msg.partition()))
            if dropped is not None:
                log.warning(
                    "consume error",
                    extra=fields(error=err.str(), topic=msg.topic(), suppressed=dropped),
                )
