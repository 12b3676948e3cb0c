"""JSON Lines -> a Kafka topic, keyed by document id: loading samples and backfills.

Lines are sent as they are (the service decodes them); the key is the line's id when the
line parses as a JSON object with one, else no key, so a malformed line still reaches the
topic and, from there, the dead-letter topic with its reason: nothing is filtered here.

A line the producer or the broker refuses (larger than ``message.max.bytes``, say) is
reported with its line number and the reason, and the others are sent (``on_error="skip"``),
or sending stops at it (``"fail"``); the summary counts both. A broker that stops answering
is not a refusal of one line: it fails the command, as below.

Nothing waits without bound: before the first line the broker must answer a metadata
request within ``probe_timeout_s`` (else nothing is sent), and each line must be delivered
within ``message.timeout.ms`` (30 s unless the configuration says otherwise), so a broker
that is down, or goes away midway, fails the command with a message instead of a hang.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from stream_dedup.errors import StreamDedupError
from stream_dedup.service.broker_watch import BrokerWatch, LibrdkafkaLog
from stream_dedup.service.kafka_settings import client_config, python_client_keys

log = logging.getLogger("stream_dedup.tools.produce")

#: How long a line may wait for its delivery unless ``[kafka]`` sets ``message.timeout.ms``
#: (the service's producer waits librdkafka's 5 minutes: it retries failed events itself).
MESSAGE_TIMEOUT_MS = 30_000


OnError = Literal["skip", "fail"]

#: Refused lines reported one by one; the rest are counted.
REFUSED_SHOWN = 10

#: Delivery errors that say the broker is gone or too slow, not that it refused the line.
OUTAGE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
    }
)


class ProduceError(StreamDedupError):
    """Some lines could not be delivered to the topic (no broker, no topic, an outage)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One line not sent: the producer refused it at ``produce()`` (``by="producer"``), or
    its delivery report carried the broker's refusal (``by="broker"``)."""

    line_no: int
    by: Literal["producer", "broker"]
    reason: str

    def render(self) -> str:
        who = "the producer, not sent" if self.by == "producer" else "the broker"
        return f"line {self.line_no}: refused by {who}: {self.reason}"


@dataclass(slots=True)
class ProduceSummary:
    """What a run of :func:`produce_lines` sent and what was refused."""

    delivered: int = 0
    #: Lines refused, by the producer or by the broker.
    refused: int = 0
    #: Of :attr:`refused`, those the broker refused (handed to the producer first).
    refused_by_broker: int = 0
    #: The first :data:`REFUSED_SHOWN` refusals, in the order they were reported.
    refusals: list[Refusal] = field(default_factory=list)
    #: Under ``on_error="fail"``: the refusal that stopped the run.
    stopped_at: Refusal | None = None


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
    if error is not None and error.code() == KafkaError.TOPIC_EXCEPTION:
        raise ProduceError(
            f"the broker at {bootstrap} refuses {topic!r} as a topic name ({error.str()}); "
            "nothing was sent. Name a topic with --topic in letters, digits, '.', '_' and "
            "'-' (at most 249 characters)"
        )
    if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise ProduceError(
            f"the broker at {bootstrap} does not allow writing to topic {topic!r} "
            f"({error.str()}); nothing was sent. Ask for write access to it, or check the "
            "credentials in the [kafka] settings (sasl.username, ssl.*)"
        )


def _reason(err: KafkaError, size: int, limit: str | None) -> str:
    """What is wrong with a refused line, and for one too large what to do; ``limit`` is
    the producer's ``message.max.bytes`` when the producer refused it, else ``None``."""
    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE and limit is not None:
        return (
            f"too large ({size:,} bytes; message.max.bytes is {limit}): shorten the line, "
            "or raise the limit with --set kafka.message.max.bytes=N where the broker and "
            "topic accept larger messages"
        )
    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return (
            f"too large for the topic ({size:,} bytes; {err.str()}): shorten the line, or "
            "raise the topic's max.message.bytes"
        )
    return f"{err.str()} ({err.name()})"


def produce_lines(
    lines: Iterable[bytes],
    topic: str,
    kafka: Mapping[str, str],
    *,
    id_field: str = "id",
    on_error: OnError = "skip",
    report: IO[str] | None = None,
    progress: Callable[[int], None] | None = None,
    probe_timeout_s: float = 10.0,
) -> ProduceSummary:
    """Produce every non-blank line to ``topic``; returns what was delivered and refused.

    Raises :class:`ProduceError` if no broker answers within ``probe_timeout_s``, or the
    topic is missing or refused (before anything is sent), or when a line's delivery fails
    for want of a broker (each waits at most ``message.timeout.ms``); the message names the
    bootstrap address and what to check. Refused lines are written to ``report``, see
    :func:`send_lines`.
    """
    conf = _producer_config(kafka)
    bootstrap = str(conf.get("bootstrap.servers", ""))
    watch = BrokerWatch("producer")
    watch.bind(conf)
    conf["error_cb"] = watch
    conf["logger"] = LibrdkafkaLog(log)
    producer = Producer(conf)
    _probe(producer, bootstrap, topic, probe_timeout_s)
    summary = send_lines(
        producer,
        lines,
        topic,
        bootstrap=bootstrap,
        timeout_s=float(conf["message.timeout.ms"]) / 1000.0,
        size_limit=str(conf.get("message.max.bytes", "1000000")),
        id_field=id_field,
        on_error=on_error,
        report=report,
        progress=progress,
    )
    watch.alive()
    return summary


def send_lines(
    producer: Producer,
    lines: Iterable[bytes],
    topic: str,
    *,
    bootstrap: str,
    timeout_s: float,
    size_limit: str = "1000000",
    id_field: str = "id",
    on_error: OnError = "skip",
    report: IO[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> ProduceSummary:
    """Send each non-blank line of ``lines`` with ``producer``, then flush it.

    A line that ``produce()`` refuses, or whose delivery report carries an error other
    than an outage's (:data:`OUTAGE_CODES`), is counted and written to ``report`` with its
    line number (1-based, blank lines counted) and the reason, the first
    :data:`REFUSED_SHOWN` in full. With ``on_error="fail"`` nothing is produced after the
    first, which is not written (it is :attr:`ProduceSummary.stopped_at`, for the caller to
    report), and the lines already handed to the producer are still delivered. An outage
    raises :class:`ProduceError`.
    """
    sender = _Sender(producer, topic, bootstrap, size_limit, id_field, on_error, report)
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        sender.send(line_no, line)
        if sender.summary.stopped_at is not None:
            break
        if progress is not None and sender.queued and sender.queued % 1000 == 0:
            progress(sender.queued)
    return sender.finish(timeout_s)


class _Sender:
    """One :func:`send_lines` run: what was queued, refused, and lost to an outage."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        bootstrap: str,
        size_limit: str,
        id_field: str,
        on_error: OnError,
        report: IO[str] | None,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._bootstrap = bootstrap
        self._size_limit = size_limit
        self._id_field = id_field
        self._on_error = on_error
        self._report = report
        self.summary = ProduceSummary()
        self.queued = 0
        #: Errors of deliveries that failed for want of a broker.
        self._outage: list[str] = []

    def send(self, line_no: int, line: bytes) -> None:
        """Hand one line to the producer; a refusal is counted, an outage raised."""
        producer = self._producer
        on_delivery = functools.partial(self._delivered, line_no, len(line))
        key = _key(line, self._id_field)
        while True:
            try:
                producer.produce(self._topic, line, key=key, on_delivery=on_delivery)
                self.queued += 1
                break
            except BufferError:  # the local queue is full: wait for deliveries (or failures)
                producer.poll(0.1)
                if self._outage:
                    raise self._failed(len(producer) + len(self._outage), self._outage[0]) from None
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not isinstance(err, KafkaError) or err.fatal():
                    raise ProduceError(
                        f"the producer failed at line {line_no} ({exc}); {self.queued} lines "
                        "were handed to it before. Check the [kafka] settings and the broker "
                        f"at {self._bootstrap}"
                    ) from None
                self._refuse(
                    Refusal(line_no, "producer", _reason(err, len(line), self._size_limit))
                )
                break
        producer.poll(0)
        if self._outage:
            raise self._failed(len(producer) + len(self._outage), self._outage[0])

    def finish(self, timeout_s: float) -> ProduceSummary:
        """Flush: every line is delivered or failed within message.timeout.ms (``timeout_s``),
        so wait a little longer than that."""
        remaining = self._producer.flush(timeout_s + 5.0)
        if remaining or self._outage:
            raise self._failed(
                remaining + len(self._outage), self._outage[0] if self._outage else "timed out"
            )
        summary = self.summary
        summary.delivered = self.queued - summary.refused_by_broker
        return summary

    def _refuse(self, refusal: Refusal) -> None:
        summary, report = self.summary, self._report
        summary.refused += 1
        summary.refused_by_broker += refusal.by == "broker"
        first_to_stop = self._on_error == "fail" and summary.stopped_at is None
        if summary.refused <= REFUSED_SHOWN:
            summary.refusals.append(refusal)
            if report is not None and not first_to_stop:  # that one the caller reports
                print(refusal.render(), file=report, flush=True)
        elif summary.refused == REFUSED_SHOWN + 1 and report is not None:
            print(
                f"more refused lines: counted, not shown (the first {REFUSED_SHOWN} are)",
                file=report,
                flush=True,
            )
        if first_to_stop:
            summary.stopped_at = refusal

    def _delivered(self, line_no: int, size: int, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            return
        if err.code() in OUTAGE_CODES:
            self._outage.append(err.str())
        else:
            self._refuse(Refusal(line_no, "broker", _reason(err, size, None)))

    def _failed(self, undelivered: int, first: str) -> ProduceError:
        self._producer.purge()  # nothing left queued to wait for at exit
        return ProduceError(
            f"{undelivered} of {self.queued} lines were not delivered to {self._topic!r} at "
            f"{self._bootstrap} (first error: {first}); check that the broker is up and "
            "reachable from this host and that the topic exists"
        )
