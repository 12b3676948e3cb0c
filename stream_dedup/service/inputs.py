"""Consumed messages -> a decoded batch: documents, their sources, and what did not decode.

The service's first step of a batch, in two halves so that the costly one can run in the
sketch worker (:mod:`stream_dedup.service.prefetch.worker`), next to the sketching it feeds:

* :meth:`BatchDecoder.read` (service process): each message's position and contents, a
  :class:`~stream_dedup.service.events.Source` (events and dead letters are built from it), and
  :meth:`BatchDecoder.request`, the plain lists the worker decodes;
* :func:`~stream_dedup.decode.decode_records` (worker, or this process when there is no
  worker or it failed): JSON parsing and validation, :meth:`BatchDecoder.assemble` then
  pairs its outcome with the sources.

Either way the same function decodes the same bytes, so a batch decodes identically
wherever it was decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Message

from stream_dedup.decode import DecodedRecords, RecordFormat, decode_records
from stream_dedup.errors import DecodeError
from stream_dedup.models import Document
from stream_dedup.service.events import Source

#: What the worker is given for a batch: values, and keys and positions (text records).
RecordRequest = tuple[
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
class Records:
    """A batch in the canonical order, with each message's :class:`Source`."""

    batch: list[Message]
    sources: list[Source]

    def split(self, at: int) -> tuple[Records, Records]:
        """The first ``at`` messages and the rest, each still in the canonical order (so
        each holds one run of offsets per partition: a batch of its own)."""
        if at <= 0:
            return Records([], []), self
        if at >= len(self.sources):
            return self, Records([], [])
        return (
            Records(self.batch[:at], self.sources[:at]),
            Records(self.batch[at:], self.sources[at:]),
        )


@dataclass(frozen=True, slots=True)
class Decoded:
    """A batch (in the canonical order) decoded: its documents with their sources, in
    order, and the messages that did not decode (dead letters once the batch is built)."""

    batch: list[Message]
    docs: list[Document]
    sources: list[Source]
    undecodable: list[tuple[Source, DecodeError]]


class BatchDecoder:
    """Decodes batches of messages for one input format."""

    def __init__(self, record_format: RecordFormat) -> None:
        self.record_format = record_format

    def read(self, batch: Sequence[Message]) -> Records:
        """``batch`` (already in the canonical order) with its messages' sources."""
        return Records(list(batch), [source_of(msg) for msg in batch])

    def request(self, records: Records) -> RecordRequest:
        """The plain lists :func:`decode_records` decodes ``records`` from."""
        values = [s.value for s in records.sources]
        if not self.record_format.text:
            return values, None, None
        keys = [s.key for s in records.sources]
        positions = [(s.topic, s.partition, s.offset) for s in records.sources]
        return values, keys, positions

    def decode(self, records: Records) -> Decoded:
        """Decode ``records`` here; bad messages become dead letters once built."""
        return self.assemble(records, decode_records(*self.request(records), self.record_format))

    def assemble(self, records: Records, decoded: DecodedRecords) -> Decoded:
        """The :class:`Decoded` batch from ``records`` and what decoding them gave."""
        ids, contents, errors = decoded
        docs = list(map(Document, ids, contents))
        sources = records.sources
        if not errors:
            return Decoded(records.batch, docs, sources, [])
        bad = {i for i, _, _ in errors}
        undecodable = [
            (sources[i], DecodeError(reason, detail, sources[i].value))
            for i, reason, detail in errors
        ]
        good = [s for i, s in enumerate(sources) if i not in bad]
        return Decoded(records.batch, docs, good, undecodable)
