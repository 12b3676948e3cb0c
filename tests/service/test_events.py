"""Events and dead letters as pure functions; record decoding for Kafka messages."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from stream_dedup.decode import DocumentFormat, document_from_record
from stream_dedup.errors import DecodeError
from stream_dedup.models import Verdict, VerdictKind
from stream_dedup.service.events import Source, dead_letter, document_json, event

SOURCE = Source("news", 3, 42, 1_700_000_000_000, b"k", b'{"id": "a"}', [("h", b"v")])
SCHEMA = json.loads(
    resources.files("stream_dedup").joinpath("schemas/event.schema.json").read_text()
)
#: The schema checked once here: ``jsonschema.validate`` checks it again at every call.
jsonschema.validators.validator_for(SCHEMA).check_schema(SCHEMA)
VALIDATOR = jsonschema.validators.validator_for(SCHEMA)(SCHEMA)


def test_duplicate_event_body_headers_and_key() -> None:
    v = Verdict("a", VerdictKind.DUPLICATE, "b", 0.9, "c")
    rec = event(v, SOURCE, b'{"id": "a"}', "news.duplicates")
    body = json.loads(rec.value or b"")
    VALIDATOR.validate(body)
    assert body["offset"] == 42 and body["partition"] == 3 and body["document"] == {"id": "a"}
    assert rec.key == b"a"
    assert dict(rec.headers)["stream-dedup.verdict"] == b"duplicate"
    assert dict(rec.headers)["stream-dedup.duplicate-of"] == b"b"
    # the same inputs give the same bytes: replays are identical
    assert event(v, SOURCE, b'{"id": "a"}', "news.duplicates") == rec


def test_document_is_passed_through_byte_for_byte_or_as_a_json_string() -> None:
    v = Verdict("a", VerdictKind.UNIQUE, None, None, "a")
    raw = b'{ "id" : "a",  "text": "caf\xc3\xa9 \\u00e9", "n": 1.0 }'
    rec = event(v, SOURCE, document_json(raw, text=False), "news.unique")
    assert (rec.value or b"").endswith(b',"document":' + raw + b"}")
    body = json.loads(rec.value or b"")
    VALIDATOR.validate(body)
    assert body["document"] == json.loads(raw) and body["verdict"] == "unique"
    text = event(v, SOURCE, document_json('caf\u00e9 "q"'.encode(), text=True), "t")
    assert json.loads(text.value or b"")["document"] == 'caf\u00e9 "q"'


def test_unique_event_without_document() -> None:
    v = Verdict("a", VerdictKind.UNIQUE, None, None, "a")
    rec = event(v, SOURCE, None, "news.unique")
    body = json.loads(rec.value or b"")
    VALIDATOR.validate(body)
    assert "document" not in body
    assert "stream-dedup.duplicate-of" not in dict(rec.headers)


def test_schema_rejects_inconsistent_duplicate() -> None:
    body = json.loads(
        event(
            Verdict("a", VerdictKind.UNIQUE, None, None, "a"),
            SOURCE,
            None,
            "t",
        ).value
        or b""
    )
    body["verdict"] = "duplicate"
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(body)


def test_dead_letter_keeps_the_original_and_says_why() -> None:
    rec = dead_letter(SOURCE, "news.dlq", "invalid_json", ValueError("bad"), "decode")
    headers = dict(rec.headers)
    assert (rec.key, rec.value) == (SOURCE.key, SOURCE.value)
    assert headers["h"] == b"v"
    assert headers["__connect.errors.reason"] == b"invalid_json"
    assert headers["__connect.errors.topic"] == b"news"
    assert headers["__connect.errors.partition"] == b"3"
    assert headers["__connect.errors.offset"] == b"42"
    assert headers["__connect.errors.exception.class.name"] == b"builtins.ValueError"
    assert headers["__connect.errors.exception.message"] == b"bad"


def test_text_records_take_the_key_or_the_position() -> None:
    fmt = DocumentFormat()
    doc = document_from_record(b"hello", b"k1", ("t", 0, 5), fmt, text=True)
    assert (doc.id, doc.content) == ("k1", "hello")
    doc = document_from_record(b"hello", None, ("t", 2, 5), fmt, text=True)
    assert doc.id == "t-2-5"


@pytest.mark.parametrize(
    ("value", "text", "reason"),
    [
        (b"x" * 11, False, "too_large"),
        (None, False, "missing_content"),
        (b"\xff\xfe", True, "invalid_utf8"),
        (b"[1]", False, "not_an_object"),
    ],
)
def test_record_errors(value: bytes | None, text: bool, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        document_from_record(value, None, ("t", 0, 0), DocumentFormat(), text=text, max_bytes=10)
    assert info.value.reason == reason
    assert info.value.raw == value


def test_a_revision_event_carries_its_number_and_the_previous_text() -> None:
    first = Verdict("a", VerdictKind.UNIQUE, None, None, "a")
    second = Verdict(
        "a", VerdictKind.DUPLICATE, "b", 0.9, "b", revision=2, previous="00ff00ff00ff00ff"
    )
    plain = event(first, SOURCE, None, "news.unique")
    rec = event(second, SOURCE, None, "news.duplicates")
    body = json.loads(rec.value or b"")
    VALIDATOR.validate(body)
    assert (body["revision"], body["previous"]) == (2, "00ff00ff00ff00ff")
    assert dict(rec.headers)["stream-dedup.revision"] == b"2"
    # revision 1 carries neither field nor header: its bytes are those of a stream
    # without revisions
    assert plain.value == (
        b'{"id":"a","verdict":"unique","duplicate_of":null,"similarity":null,'
        b'"cluster_id":"a","empty":false,"topic":"news","partition":3,"offset":42,'
        b'"timestamp":1700000000000}'
    )
    assert "stream-dedup.revision" not in dict(plain.headers)
    # a revision field without its partner, or a revision number of 1, is not an event
    for broken in ({"revision": 2}, {"previous": "ab"}, {"revision": 1, "previous": "ab"}):
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate({**json.loads(plain.value or b""), **broken})


def test_containment_fields_in_events() -> None:
    excerpt = Verdict(
        "x", VerdictKind.DUPLICATE, "s", 0.41, "s", relation="excerpt", containment=0.93
    )
    rec = event(excerpt, SOURCE, None, "news.duplicates")
    assert rec.value is not None and rec.value.startswith(
        b'{"id":"x","verdict":"duplicate","duplicate_of":"s","similarity":0.41,'
        b'"relation":"excerpt","containment":0.93,"cluster_id":"s",'
    )
    VALIDATOR.validate(json.loads(rec.value))
    holder = Verdict("h", VerdictKind.UNIQUE, None, None, "h", contains=("s", 0.97))
    body = json.loads(event(holder, SOURCE, None, "news.unique").value or b"")
    VALIDATOR.validate(body)
    assert body["contains"] == {"id": "s", "containment": 0.97}
    # relation and containment come together
    for dropped in ("relation", "containment"):
        body = {k: v for k, v in json.loads(rec.value).items() if k != dropped}
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate(body)
