"""Decoding records into documents: every failure has a stable reason and keeps the bytes."""

from __future__ import annotations

import pytest

from stream_dedup.decode import (
    DocumentFormat,
    MessageFormat,
    decode_messages,
    document_from_json,
    document_from_object,
    document_from_record,
)
from stream_dedup.errors import ConfigError, DecodeError, StreamDedupError

FMT = DocumentFormat()


def test_default_format_joins_title_and_text_with_a_newline() -> None:
    doc = document_from_json(b'{"id": "a1", "title": "Hello", "text": "World", "x": 1}', FMT)
    assert (doc.id, doc.content) == ("a1", "Hello\nWorld")


def test_inputs_the_fast_parser_refuses_are_read_as_the_standard_library_reads_them() -> None:
    # NaN and lone surrogate escapes: orjson refuses them, Python's json accepts them
    doc = document_from_json(b'{"id": "a", "text": "x", "score": NaN}', FMT)
    assert (doc.id, doc.content) == ("a", "x")
    assert document_from_json(b'{"id": "a", "text": "\\ud800 x"}', FMT).content == "\ud800 x"
    # an integer id beyond 64 bits stays exact (orjson would read it as a float)
    big = 123456789012345678901234567890
    assert document_from_json(f'{{"id": {big}, "text": "x"}}'.encode(), FMT).id == str(big)
    with pytest.raises(DecodeError) as err:
        document_from_json(b'{"id": 1.5, "text": "x"}', FMT)
    assert err.value.reason == "invalid_id"
    with pytest.raises(DecodeError) as err:
        document_from_json(b'{"id": "a", "text": "\xff"}', FMT)
    assert err.value.reason == "invalid_utf8"
    with pytest.raises(DecodeError) as err:
        document_from_json(b'{"id": "a", "text": }', FMT)
    assert err.value.reason == "invalid_json" and err.value.raw == b'{"id": "a", "text": }'


def test_absent_or_null_content_fields_are_skipped() -> None:
    assert document_from_json(b'{"id": "a", "text": "only text"}', FMT).content == "only text"
    assert document_from_json(b'{"id": "a", "title": "t", "text": null}', FMT).content == "t"
    assert document_from_json(b'{"id": "a", "title": ""}', FMT).content == ""


def test_integer_id_becomes_a_string_and_str_input_works() -> None:
    assert document_from_json('{"id": 42, "title": "città"}', FMT).id == "42"
    assert document_from_json('{"id": 42, "title": "città"}', FMT).content == "città"


def test_configurable_fields_and_joiner() -> None:
    fmt = DocumentFormat(id_field="key", content_fields=("headline", "body"), joiner=" | ")
    doc = document_from_json(b'{"key": "k9", "body": "B", "headline": "H", "id": "ignored"}', fmt)
    assert (doc.id, doc.content) == ("k9", "H | B")
    with pytest.raises(DecodeError) as info:
        document_from_json(b'{"id": "a", "title": "t"}', fmt)
    assert info.value.reason == "missing_id"
    assert "'key'" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "detail"),
    [(b'{"title": "t"}', "no 'id' field"), (b'{"id": null, "title": "t"}', "'id' is null")],
)
def test_a_null_id_is_reported_as_null_not_as_absent(raw: bytes, detail: str) -> None:
    with pytest.raises(DecodeError) as info:
        document_from_json(raw, FMT)
    assert info.value.reason == "missing_id"  # one reason (and metric label) for both
    assert info.value.detail == detail


def test_format_validation() -> None:
    with pytest.raises(ConfigError, match="id_field"):
        DocumentFormat(id_field="")
    with pytest.raises(ConfigError, match="content_fields"):
        DocumentFormat(content_fields=())


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"id": "a", "title": ', "invalid_json"),
        (b"", "invalid_json"),
        (b"not json", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"a string"', "not_an_object"),
        (b"null", "not_an_object"),
        (b'{"title": "t"}', "missing_id"),
        (b'{"id": null, "title": "t"}', "missing_id"),
        (b'{"id": true, "title": "t"}', "invalid_id"),
        (b'{"id": 1.5, "title": "t"}', "invalid_id"),
        (b'{"id": ["a"], "title": "t"}', "invalid_id"),
        (b'{"id": "", "title": "t"}', "invalid_id"),
        (b'{"id": "a"}', "missing_content"),
        (b'{"id": "a", "title": null, "text": null}', "missing_content"),
        (b'{"id": "a", "title": 5}', "invalid_content"),
        (b'{"id": "a", "title": "t", "text": {"x": 1}}', "invalid_content"),
        (b'{"id": "a", "title": "\xff\xfe"}', "invalid_utf8"),
        (b"\xc3\x28", "invalid_utf8"),
    ],
)
def test_every_decode_error_reason_keeps_raw_bytes(raw: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        document_from_json(raw, FMT)
    err = info.value
    assert err.reason == reason
    assert err.raw == raw
    assert str(err).startswith(f"{reason}: ")
    assert err.detail
    assert isinstance(err, StreamDedupError)


def test_reasons_are_a_closed_set() -> None:
    with pytest.raises(ValueError, match="unknown decode reason"):
        DecodeError("bogus", "x")
    assert {"invalid_json", "invalid_utf8", "missing_content"} <= set(DecodeError.REASONS)


def test_document_from_object_without_raw() -> None:
    with pytest.raises(DecodeError) as info:
        document_from_object({"id": "a"}, FMT)
    assert (info.value.reason, info.value.raw) == ("missing_content", None)
    assert document_from_object({"id": 7, "text": "x"}, FMT).id == "7"


def test_lone_surrogate_escape_decodes() -> None:
    """A JSON escape of a lone surrogate is valid JSON and must not be an error here."""
    doc = document_from_json(b'{"id": "a", "title": "x \\ud800 y"}', FMT)
    assert doc.content == "x \ud800 y"


def test_a_batch_decodes_record_by_record_as_document_from_record_decides() -> None:
    """The batch decoder's one-pass reading of common records changes no outcome."""
    fmt = MessageFormat(max_bytes=200)
    values: list[bytes | None] = [
        b'{"id": "a", "title": "T", "text": "body"}',
        b'{"id": 7, "title": "T", "text": "int id"}',
        b'{"id": 123456789012345678901234567890, "text": "big int id"}',
        b'{"id": 1.5, "text": "float id"}',
        b'{"id": "b", "text": "no title"}',
        b'{"id": "c", "title": null, "text": "null title"}',
        b'{"id": "", "text": "empty id"}',
        b'{"id": "d", "title": 3, "text": "number title"}',
        b'{"id": "e"}',
        b'["not", "an", "object"]',
        b'{"id": "f", "text": "lone \\ud800 surrogate"}',
        b'{"id": "g", "text": NaN}',
        b"{not json",
        b'{"id": "h", "text": "\xff"}',
        b'{"id": "i", "text": "' + b"x" * 300 + b'"}',
        None,
    ]
    ids, contents, errors = decode_messages(values, None, None, fmt)
    expected_docs, expected_errors = [], []
    for i, value in enumerate(values):
        try:
            doc = document_from_record(
                value, None, ("", 0, 0), fmt.document, max_bytes=fmt.max_bytes
            )
        except DecodeError as exc:
            expected_errors.append((i, exc.reason, exc.detail))
        else:
            expected_docs.append((doc.id, doc.content))
    assert list(zip(ids, contents, strict=True)) == expected_docs
    assert errors == expected_errors
    assert ("a", "T\nbody") in expected_docs and len(expected_docs) == 6
