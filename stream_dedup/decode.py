"""Raw records -> documents. Shared by the offline command and the Kafka service.

Every failure is a :class:`~stream_dedup.errors.DecodeError` with a stable reason code and
the raw bytes, so the caller can report or dead-letter the record without losing it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from stream_dedup.errors import ConfigError, DecodeError
from stream_dedup.models import Document


@dataclass(frozen=True, slots=True)
class DocumentFormat:
    """How a JSON object becomes a document: which field is the id, which hold the text.

    Content fields are joined by ``joiner`` in the order given; a missing or null field
    counts as absent, and a document with none of them present is malformed.
    """

    id_field: str = "id"
    content_fields: tuple[str, ...] = ("title", "text")
    joiner: str = "\n"
    #: A field holding the document's time (epoch milliseconds or ISO-8601; naive means
    #: UTC), which retention measures; empty: documents have no time. A record whose
    #: field is missing or unreadable keeps the stream's clock where it is.
    time_field: str = ""

    def __post_init__(self) -> None:
        if not self.id_field:
            raise ConfigError("id_field", "must not be empty")
        if not self.content_fields:
            raise ConfigError("content_fields", "name at least one field")


def document_from_object(obj: Any, fmt: DocumentFormat, raw: bytes | None = None) -> Document:
    """A document from a parsed JSON value, or a DecodeError saying what is wrong."""
    if not isinstance(obj, dict):
        raise DecodeError("not_an_object", f"expected a JSON object, got {type(obj).__name__}", raw)
    if fmt.id_field not in obj:
        raise DecodeError("missing_id", f"no {fmt.id_field!r} field", raw)
    if obj[fmt.id_field] is None:  # counted as missing, as a null content field is absent
        raise DecodeError("missing_id", f"{fmt.id_field!r} is null", raw)
    doc_id = obj[fmt.id_field]
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int):
        raise DecodeError(
            "invalid_id", f"{fmt.id_field!r} must be a string, got {type(doc_id).__name__}", raw
        )
    doc_id = str(doc_id)
    if not doc_id:
        raise DecodeError("invalid_id", f"{fmt.id_field!r} is empty", raw)
    parts: list[str] = []
    for name in fmt.content_fields:
        value = obj.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise DecodeError(
                "invalid_content",
                f"field {name!r} must be a string, got {type(value).__name__}",
                raw,
            )
        parts.append(value)
    if not parts:
        wanted = ", ".join(repr(f) for f in fmt.content_fields)
        raise DecodeError("missing_content", f"none of the content fields {wanted} present", raw)
    time = parse_time(obj.get(fmt.time_field)) if fmt.time_field else None
    return Document(doc_id, fmt.joiner.join(parts), time)


def parse_time(raw: object) -> int | None:
    """Epoch milliseconds from a number (already milliseconds) or an ISO-8601 string."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return int(raw) if raw == raw and abs(raw) < 1e16 else None
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw.strip())
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return int(parsed.timestamp() * 1000)
    return None


def _parse(raw: bytes | str, id_field: str) -> Any:
    """The JSON value of a record, or a DecodeError (``invalid_utf8``/``invalid_json``).

    orjson parses (several times faster than the standard library on news-sized records);
    the standard library decides whatever orjson refuses (NaN, lone surrogate escapes)
    and re-reads a record whose id orjson read as a float, since orjson turns integers
    beyond 64 bits into floats. The records accepted, and the ids read, are therefore
    exactly the standard library's.
    """
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if not (isinstance(obj, dict) and isinstance(obj.get(id_field), float)):
            return obj
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError("invalid_utf8", str(exc), raw) from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raw_bytes = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        raise DecodeError("invalid_json", str(exc), raw_bytes) from exc


def document_from_json(raw: bytes | str, fmt: DocumentFormat) -> Document:
    """A document from one JSON text (bytes must be UTF-8)."""
    obj = _parse(raw, fmt.id_field)
    raw_bytes = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return document_from_object(obj, fmt, raw_bytes)


def record_id(key: bytes | None, topic: str, partition: int, offset: int) -> str:
    """A plain-text message's id: its key as UTF-8, else ``topic-partition-offset``."""
    if key:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError("invalid_id", f"message key is not UTF-8: {exc}", key) from exc
    return f"{topic}-{partition}-{offset}"


def document_from_record(
    value: bytes | None,
    key: bytes | None,
    position: tuple[str, int, int],
    fmt: DocumentFormat,
    *,
    text: bool = False,
    max_bytes: int | None = None,
) -> Document:
    """A document from one stream record (a Kafka message's value and key).

    ``position`` is (topic, partition, offset). JSON records go through
    :func:`document_from_json`; with ``text=True`` the whole value is the content (UTF-8)
    and the id comes from :func:`record_id`. A record over ``max_bytes`` is rejected as
    ``too_large`` before any parsing, and a record without a value as ``missing_content``.
    """
    if value is None:
        raise DecodeError("missing_content", "message has no value (tombstone)", value)
    if max_bytes is not None and len(value) > max_bytes:
        raise DecodeError(
            "too_large", f"value is {len(value)} bytes, the maximum is {max_bytes}", value
        )
    if not text:
        return document_from_json(value, fmt)
    try:
        content = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_utf8", str(exc), value) from exc
    return Document(record_id(key, *position), content)


@dataclass(frozen=True, slots=True)
class MessageFormat:
    """How a stream record becomes a document: :func:`document_from_record`'s settings.

    A plain value, so the sketch worker (:mod:`stream_dedup.service.prefetch.worker`) can be given
    it and decode records exactly as the service process would.
    """

    document: DocumentFormat = field(default_factory=DocumentFormat)
    text: bool = False
    max_bytes: int | None = None


#: A batch of records decoded: the documents' ids and contents, in order, and
#: ``(position in the batch, reason, detail)`` of each record that did not decode.
DecodeOutcome = tuple[list[str], list[str], list[tuple[int, str, str]]]

_NO_POSITION = ("", 0, 0)


def decode_messages(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    positions: Sequence[tuple[str, int, int]] | None,
    fmt: MessageFormat,
) -> DecodeOutcome:
    """Decode a batch of records; ``keys`` and ``positions`` matter only for text records.

    Plain lists in, plain lists out: what crosses to and from the sketch worker.
    """
    ids: list[str] = []
    contents: list[str] = []
    errors: list[tuple[int, str, str]] = []
    doc_fmt = fmt.document
    id_field, fields, joiner = doc_fmt.id_field, doc_fmt.content_fields, doc_fmt.joiner
    limit, json_records = fmt.max_bytes, not fmt.text
    for i, value in enumerate(values):
        if json_records and value is not None and (limit is None or len(value) <= limit):
            # The common record, read in one pass: an object with a non-empty string id
            # and every content field a string. Anything else (an error, an integer or
            # float id, an absent field) takes the full path below, which decides it.
            try:
                obj = orjson.loads(value)
            except orjson.JSONDecodeError:
                obj = None
            if type(obj) is dict:
                doc_id = obj.get(id_field)
                parts = [obj.get(name) for name in fields]
                if type(doc_id) is str and doc_id and all(type(p) is str for p in parts):
                    ids.append(doc_id)
                    contents.append(joiner.join(parts))  # type: ignore[arg-type]
                    continue
        try:
            doc = document_from_record(
                value,
                keys[i] if keys is not None else None,
                positions[i] if positions is not None else _NO_POSITION,
                fmt.document,
                text=fmt.text,
                max_bytes=fmt.max_bytes,
            )
        except DecodeError as exc:
            errors.append((i, exc.reason, exc.detail))
            continue
        ids.append(doc.id)
        contents.append(doc.content)
    return ids, contents, errors
