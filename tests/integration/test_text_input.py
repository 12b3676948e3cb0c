"""Plain-text input (``input.format = "text"``) through a real broker.

In text mode the whole message value is the content and the id is the message key, or
``<topic>-<partition>-<offset>`` for a message without one. Near-duplicates must be found
across both kinds of id, and a value that is not UTF-8 must reach the dead-letter topic
with its original bytes instead of stopping the stream.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import (
    ServiceThread,
    Topics,
    events,
    kijiji_documents,
    make_config,
    offline_reference,
    produce,
    read_topic,
)

pytestmark = pytest.mark.broker

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]


def test_text_messages_keyed_and_unkeyed_match_the_offline_run(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    texts = [d["title"] for d in kijiji_documents(300)]
    # Every third message has no key, so its id is its position; the rest are keyed.
    records: list[Record] = []
    expected_ids: list[str] = []
    bad_offsets: dict[int, tuple[str, bytes | None, bytes]] = {}
    for i, text in enumerate(texts):
        offset = len(records)
        if i == 150:  # a value that is not UTF-8 (Latin-1 bytes), keyed and with a header
            value = "caffè e cornetto, bilocale in centro".encode("latin-1")
            records.append((b"latin-1", value, [("origin", b"crawler-7")]))
            bad_offsets[offset] = ("invalid_utf8", b"latin-1", value)
            offset += 1
        if i == 200:  # a key that is not UTF-8: the id cannot be read
            value = b"an otherwise fine text"
            records.append((b"\xff\xfe", value, None))
            bad_offsets[offset] = ("invalid_id", b"\xff\xfe", value)
            offset += 1
        if i % 3 == 0:
            records.append((None, text.encode(), None))
            expected_ids.append(f"{topics.input}-0-{offset}")
        else:
            records.append((f"ad-{i}".encode(), text.encode(), None))
            expected_ids.append(f"ad-{i}")
    produce(bootstrap, topics.input, records)

    reference = offline_reference(
        [{"id": doc_id, "title": text} for doc_id, text in zip(expected_ids, texts, strict=True)],
        tmp_path,
    )
    duplicates_ref = [v for v in reference.values() if v["verdict"] == "duplicate"]
    # the run must pair ids of both kinds, or it would not show the positional ids work
    assert any(str(v["duplicate_of"]).startswith(topics.input) for v in duplicates_ref)
    assert any(str(v["duplicate_of"]).startswith("ad-") for v in duplicates_ref)

    config = make_config(bootstrap, topics, tmp_path / "index", input={"format": "text"})
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(records))
    svc.wait_for("stream_dedup_index_documents", len(texts))
    assert svc.service.index.offsets() == {(topics.input, 0): len(records)}
    assert svc.stop() == 0

    out = read_topic(bootstrap, topics.unique, 1, timeout_s=20) + read_topic(
        bootstrap, topics.duplicates, 1, timeout_s=20
    )
    got = {e["id"]: e for e in events(out)}
    assert len(out) == len(texts)
    assert sorted(got) == sorted(expected_ids)
    for doc_id, text in zip(expected_ids, texts, strict=True):
        ev, ref = got[doc_id], reference[doc_id]
        fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
        assert {k: ev[k] for k in fields} == {k: ref[k] for k in fields}, doc_id
        assert ev["document"] == text  # the text passes through as it came
        assert ev["topic"] == topics.input and ev["partition"] == 0
        if not doc_id.startswith("ad-"):
            assert doc_id == f"{topics.input}-0-{ev['offset']}"
    assert svc.metric("stream_dedup_verdicts_total", {"verdict": "duplicate"}) == len(
        duplicates_ref
    )

    dead = read_topic(bootstrap, topics.dlq, len(bad_offsets), timeout_s=20)
    assert len(dead) == len(bad_offsets)
    for msg in dead:
        headers = dict(msg.headers() or [])
        offset = int(headers["__connect.errors.offset"])
        reason, key, value = bad_offsets[offset]
        assert headers["__connect.errors.reason"] == reason.encode()
        assert headers["__connect.errors.topic"] == topics.input.encode()
        assert headers["__connect.errors.partition"] == b"0"
        assert headers["__connect.errors.stage"] == b"decode"
        assert headers["__connect.errors.exception.class.name"] == (
            b"stream_dedup.errors.DecodeError"
        )
        assert b"utf-8" in headers["__connect.errors.exception.message"].lower()
        assert msg.key() == key and msg.value() == value  # the original bytes, unchanged
        assert svc.metric("stream_dedup_dead_letters_total", {"reason": reason}) == 1
    assert dict(dead[0].headers() or [])["origin"] == b"crawler-7"
