"""Consumed messages -> a decoded batch: documents, their sources, and what did not decode.

The service's first step of a batch, in two halves so that the costly one can run in the
sketch worker (:mod:`stream_dedup.service.prefetch.worker`), next to the sketching it feeds:

* :meth:`InputDecoder.read` (service process): each message's position and contents, a
  :class:`~stream_dedup.service.events.Source` (events and dead letters are built from it), and
  :meth:`InputDecoder.request`, the plain lists the worker decodes;
* :func:`~stream_dedup.decode.decode_messages` (worker, or this process when there is no
  worker or it failed): JSON parsing and validation, :meth:`InputDecoder.assemble` then
  pairs its outcome with the sources.

Either way the same function decodes the same bytes, so a batch decodes identically
wherever it was decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from stream_dedup.decode import DecodeOutcome, MessageFormat, decode_messages
from stream_dedup.errors import DecodeError
from stream_dedup.models import Document
from stream_dedup.service.events import Source
from stream_dedup.service.ordering import RecordTime

#: What the worker is given for a batch: values, and keys and positions (text records).
DecodeRequest = tuple[
    list[bytes | None], list[bytes | None] | None, list[tuple[str, int, int]] | None
]


def source_of(msg: Message) -> Source:
    """The position and contents of a consumed (error-free) message."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    ts_type, ts = msg.timestamp()
    headers = msg.headers() or []
    return Source(
        topic,
        partition,
        offset,
        ts if ts_type else None,
        msg.key(),
        msg.value(),
        list(headers.items()) if isinstance(headers, dict) else list(headers),
    )


@dataclass(frozen=True, slots=True)
class MessageBatch:
    """A batch in time order, with each message's :class:`Source`."""

    batch: list[Message]
    sources: list[Source]

    def split(self, at: int) -> tuple[MessageBatch, MessageBatch]:
        """The first ``at`` messages and the rest, each still in time order (so
        each holds one run of offsets per partition: a batch of its own)."""
        if at <= 0:
            return MessageBatch([], []), self
        if at >= len(self.sources):
            return self, MessageBatch([], [])
        return (
            MessageBatch(self.batch[:at], self.sources[:at]),
            MessageBatch(self.batch[at:], self.sources[at:]),
        )


@dataclass(frozen=True, slots=True)
class Decoded:
    """A batch (in time order) decoded: its documents with their sources, in
    order, and the messages that did not decode (dead letters once the batch is built)."""

    batch: list[Message]
    docs: list[Document]
    sources: list[Source]
    undecodable: list[tuple[Source, DecodeError]]
    #: Documents whose ``input.time_field`` was missing or unreadable (their time is the
    #: message timestamp's); 0 when no field is named.
    time_field_missing: int = 0


class InputDecoder:
    """Decodes batches of messages for one input format."""

    def __init__(self, message_format: MessageFormat, time_of: RecordTime | None = None) -> None:
        """``time_of`` gives a record's time (by default its message timestamp), which
        becomes its document's time (:attr:`~stream_dedup.models.Document.time`)."""
        self.message_format = message_format
        self.time_of = time_of if time_of is not None else RecordTime()

    def read(self, batch: Sequence[Message]) -> MessageBatch:
        """``batch`` (already in time order) with its messages' sources."""
        return MessageBatch(list(batch), [source_of(msg) for msg in batch])

    def request(self, records: MessageBatch) -> DecodeRequest:
        """The plain lists :func:`decode_messages` decodes ``records`` from."""
        values = [s.value for s in records.sources]
        if not self.message_format.text:
            return values, None, None
        keys = [s.key for s in records.sources]
        positions = [(s.topic, s.partition, s.offset) for s in records.sources]
        return values, keys, positions

    def decode(self, records: MessageBatch) -> Decoded:
        """Decode ``records`` here; bad messages become dead letters once built."""
        return self.assemble(records, decode_messages(*self.request(records), self.message_format))

    def assemble(self, records: MessageBatch, decoded: DecodeOutcome) -> Decoded:
        """The :class:`Decoded` batch from ``records`` and what decoding them gave."""
        ids, contents, errors = decoded
        sources = records.sources
        bad = {i for i, _, _ in errors}
        good = [s for i, s in enumerate(sources) if i not in bad] if bad else sources
        found = self.time_of.found
        timed = [found(s.value, s.timestamp) for s in good]
        times = [t if t > 0 else None for t, _ in timed]
        missing = sum(m for _, m in timed) if self.time_of.field else 0
        docs = list(map(Document, ids, contents, times))
        undecodable = [
            (sources[i], DecodeError(reason, detail, sources[i].value))
            for i, reason, detail in errors
        ]
        return Decoded(records.batch, docs, good, undecodable, missing)
