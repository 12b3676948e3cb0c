"""Records the broker (or the client) refuses for good, and what replaces them.

Retrying a record that can never be accepted blocks its batch, and so its partitions,
forever: an event made too large by ``output.include_document`` copying a huge document
(``MSG_SIZE_TOO_LARGE``, from the client's ``message.max.bytes`` or the topic's
``max.message.bytes``), a topic the service may not write (``TOPIC_AUTHORIZATION_FAILED``).
The producer (:class:`~stream_dedup.service.kafka.EventProducer`, both delivery modes)
asks the batch's :data:`Refused` callback for a replacement instead, at once and without
backoff (librdkafka already retried what it could):

1. an event -> the dead letter of its input message (reason ``refused``, stage
   ``produce``, the same ``__connect.errors.*`` headers as every dead letter);
2. a dead letter -> the same dead letter without its value, with the header
   :data:`HEADER_VALUE_DROPPED` saying how many bytes were dropped and why (the input
   message stays in the input topic, at the offset the headers name);
3. a dead letter without a value -> :class:`~stream_dedup.errors.RecordRefusedError`:
   the dead-letter topic itself refuses records, and going on would lose them silently.

Any other failure is not the record's fault (the broker is away, a leader moves) and is
retried with backoff while the service runs, as before.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from stream_dedup.errors import RecordRefusedError
from stream_dedup.service.events import OutRecord

#: Errors that say the record itself will never be accepted, however often it is sent.
PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    }
)

#: On a dead letter sent without its value: ``<bytes> bytes dropped: <error>``.
HEADER_VALUE_DROPPED = "stream-dedup.value-dropped"

#: Given a refused record and why, the record to send instead (or raises).
Refused = Callable[[OutRecord, KafkaError], OutRecord]


def refusal(exc: KafkaException) -> KafkaError | None:
    """The error of a client exception if it refuses the record for good, else None."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) and permanent(err) else None


def permanent(err: KafkaError) -> bool:
    """Whether ``err`` (from ``produce`` or a delivery report) refuses its record for good."""
    return err.code() in PERMANENT and not err.fatal()


def refuse_all(rec: OutRecord, err: KafkaError) -> OutRecord:
    """The :data:`Refused` of a producer given none: nothing can replace the record."""
    raise RecordRefusedError(rec.topic, err.str())


def without_value(rec: OutRecord, err: KafkaError) -> OutRecord:
    """A refused dead letter, sent again without its value (the input message's bytes),
    saying so in :data:`HEADER_VALUE_DROPPED`; one already without a value cannot shrink."""
    if rec.value is None:
        raise RecordRefusedError(rec.topic, f"{err.str()} (even without its value)")
    note = f"{len(rec.value)} bytes dropped: {err.str()}"
    return OutRecord(rec.topic, rec.key, None, [*rec.headers, (HEADER_VALUE_DROPPED, note)])
