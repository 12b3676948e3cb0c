"""Verdicts and rejected messages -> the records the service produces.

Two kinds of output record, both keyed so that everything about one document lands on one
partition:

* an **event** (to the unique or the duplicates topic), keyed by document id. Its value is
  the JSON object described by ``stream_dedup/schemas/event.schema.json``::

      {"id": "a1", "verdict": "duplicate", "duplicate_of": "a0", "similarity": 0.91,
       "cluster_id": "a0", "empty": false, "topic": "news", "partition": 0,
       "offset": 42, "timestamp": 1717000000000, "document": {...}}

  A new revision of an id (see ``docs/revisions.md``) also carries ``"revision": 2`` (3,
  ...) and ``"previous"``, the text tag of the revision before; the event of an id's
  first text has neither, so it is byte for byte what it was before revisions existed.

  ``timestamp`` is the input message's timestamp in milliseconds (``null`` if it had
  none); ``document`` is the original JSON object, byte for byte as it arrived (or the
  text, as a JSON string), unless pass-through is off.
  Headers carry the verdict so consumers can route without parsing: see
  :data:`HEADER_VERDICT` and friends.

* a **dead letter** (to the dead-letter topic): the original key, value and headers,
  plus headers in Kafka Connect's ``__connect.errors.*`` convention (see
  :func:`dead_letter`).

Events are a pure function of (verdict, source message): a replayed batch re-emits
byte-identical events, which is what makes at-least-once delivery harmless downstream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from stream_dedup.models import Verdict, VerdictKind

Headers = list[tuple[str, str | bytes | None]]

#: ``unique`` or ``duplicate``.
HEADER_VERDICT = "stream-dedup.verdict"
#: The cluster id (first document of the duplicate cluster).
HEADER_CLUSTER = "stream-dedup.cluster-id"
#: The id of the best earlier match; only on duplicates.
HEADER_DUPLICATE_OF = "stream-dedup.duplicate-of"
#: The revision number, in decimal; only from revision 2 on (see ``docs/revisions.md``).
HEADER_REVISION = "stream-dedup.revision"

#: Dead-letter headers (Kafka Connect's names; ``reason`` is ours, a stable code).
DLQ_REASON = "__connect.errors.reason"
DLQ_TOPIC = "__connect.errors.topic"
DLQ_PARTITION = "__connect.errors.partition"
DLQ_OFFSET = "__connect.errors.offset"
DLQ_STAGE = "__connect.errors.stage"
DLQ_EXCEPTION_CLASS = "__connect.errors.exception.class.name"
DLQ_EXCEPTION_MESSAGE = "__connect.errors.exception.message"


_KIND_BYTES = {kind: kind.encode() for kind in VerdictKind}


@dataclass(slots=True)  # not frozen: built per message (see index.records.DocRecord)
class Source:
    """Where an input message came from, and what it carried."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(slots=True)  # not frozen: built per event (see index.records.DocRecord)
class OutRecord:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


def _dumps(body: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON; text with lone surrogates falls back to ASCII escapes."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:  # a str with lone surrogates
        return json.dumps(body, separators=(",", ":")).encode("ascii")


def document_json(value: bytes, *, text: bool) -> bytes:
    """What an event's ``document`` field holds for an input message's value.

    A JSON record is passed through as its own bytes, never parsed and re-encoded: it has
    been parsed once already, so it is valid JSON, and re-encoding a news article would
    cost more than deciding it. A text record (valid UTF-8, already checked) becomes a
    JSON string.
    """
    return orjson.dumps(value.decode("utf-8")) if text else value


def event(verdict: Verdict, source: Source, document: bytes | None, topic: str) -> OutRecord:
    """The event for one decided document; ``document`` is its JSON text, or None to omit it.

    The fields are encoded once and the document's JSON (see :func:`document_json`)
    spliced in as the last member, so the event is a pure function of its inputs.
    """
    body: dict[str, Any] = verdict.to_json()
    body["empty"] = verdict.empty
    body["topic"] = source.topic
    body["partition"] = source.partition
    body["offset"] = source.offset
    body["timestamp"] = source.timestamp
    value = _dumps(body)
    if document is not None:
        value = b"".join((value[:-1], b',"document":', document, b"}"))
    headers: Headers = [
        (HEADER_VERDICT, _KIND_BYTES[verdict.verdict]),
        (HEADER_CLUSTER, verdict.cluster_id.encode("utf-8", "surrogatepass")),
    ]
    if verdict.duplicate_of is not None:
        headers.append((HEADER_DUPLICATE_OF, verdict.duplicate_of.encode("utf-8", "surrogatepass")))
    if verdict.revision != 1:
        headers.append((HEADER_REVISION, str(verdict.revision).encode()))
    return OutRecord(topic, verdict.id.encode("utf-8", "surrogatepass"), value, headers)


def dead_letter(
    source: Source, topic: str, reason: str, error: BaseException, stage: str
) -> OutRecord:
    """The original message for the dead-letter topic, with the why in its headers.

    Headers added after the original ones: ``__connect.errors.reason`` (a stable code:
    ``invalid_json``, ``not_an_object``, ``missing_id``, ``invalid_id``, ``missing_content``,
    ``invalid_content``, ``invalid_utf8``, ``too_large``, ``processing_error``, ``refused``:
    the broker refused its event for good, see :mod:`.refusals`),
    ``__connect.errors.topic`` / ``.partition`` / ``.offset`` (the source),
    ``__connect.errors.stage`` (``decode``, ``process`` or ``produce``),
    ``__connect.errors.exception.class.name`` and ``__connect.errors.exception.message``.
    """
    headers = list(source.headers)
    headers += [
        (DLQ_REASON, reason.encode()),
        (DLQ_TOPIC, source.topic.encode()),
        (DLQ_PARTITION, str(source.partition).encode()),
        (DLQ_OFFSET, str(source.offset).encode()),
        (DLQ_STAGE, stage.encode()),
        (DLQ_EXCEPTION_CLASS, f"{type(error).__module__}.{type(error).__qualname__}".encode()),
        (DLQ_EXCEPTION_MESSAGE, str(error)[:4096].encode("utf-8", "replace")),
    ]
    return OutRecord(topic, source.key, source.value, headers)
