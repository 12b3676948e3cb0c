"""The service over records that lack ``input.time_field``: decided on the message
timestamp, counted, and warned about in the log (bounded), never in silence."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from .support import ServiceThread, Topics, make_config, produce_json

pytestmark = pytest.mark.broker


def test_a_time_field_no_record_has_is_counted_and_warned(
    bootstrap: str, topics: Topics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs = [
        {"id": f"d{i}", "title": f"story {i}", "text": f"body of story number {i}"}
        for i in range(30)
    ]
    produce_json(bootstrap, topics.input, docs)
    sections = {"input": {"time_field": "nosuch"}, "batch": {"max_messages": 5}}
    config = make_config(bootstrap, topics, tmp_path / "index", **sections)
    config = replace(config, index=replace(config.index, retention="1h"))
    caplog.set_level(logging.WARNING, "stream_dedup.service")
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs))
    assert svc.stop() == 0
    assert svc.metric("stream_dedup_time_field_missing_total") == len(docs)
    assert svc.metric("stream_dedup_untimed_documents_total") == 0  # message timestamps
    warned = [r for r in caplog.records if "input.time_field 'nosuch'" in r.getMessage()]
    assert len(warned) == 1, "one warning a minute, not one per batch of 5"
