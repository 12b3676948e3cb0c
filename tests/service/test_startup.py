"""Start-up over an existing index: the key filter is built from it, with progress lines,
while the health probe stays green (a large index takes seconds to scan), unless the
last process to write the index closed it and saved its filter, which is then loaded."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from stream_dedup.index import epoch_filters, store
from stream_dedup.models import Document
from stream_dedup.service import loop as service_module
from stream_dedup.service.config import HttpConfig, IndexConfig, ServiceConfig
from stream_dedup.service.loop import Service


def test_the_key_filter_is_built_with_progress_and_heartbeats(
    tmp_path: Path,
    kijiji_ads: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    package_logs: list[logging.LogRecord],
) -> None:
    # Never run, so never serving: no HTTP port (the constructor would bind one).
    config = ServiceConfig(index=IndexConfig(path=str(tmp_path / "index")), http=HttpConfig(False))
    first = Service(config)
    docs = [Document(i, c) for i, c in kijiji_ads[:1000]]
    for lo in range(0, len(docs), 250):
        first.dedup.process(docs[lo : lo + 250])
    first.index.close()
    saved = tmp_path / "index" / store.FILTER_FILE
    saved.unlink()  # as a killed service leaves it: no saved filter

    monkeypatch.setattr(epoch_filters, "_FILTER_CHUNK", 1000)  # a progress call per 1,000 keys
    monkeypatch.setattr(service_module, "_FILTER_LOG_EVERY", 3000)
    svc = Service(config)
    svc._last_beat = time.monotonic() - 1000  # as if start-up had taken long already
    assert svc.health()[0] is False
    filt = svc.index.load_filter(svc._filter_progress)
    assert svc.health()[0] is True  # the scan kept the loop's heartbeat fresh
    progress = [
        r for r in package_logs if r.getMessage() == "building the key filter from the index"
    ]
    assert 3 <= len(progress) <= filt.count // 3000  # one per 3,000 keys at most
    assert any(r.getMessage() == "key filter built from the index" for r in package_logs)
    assert svc.index.filter_bytes() == filt.nbytes > 0
    svc.index.close()
    assert saved.exists()

    package_logs.clear()
    again = Service(config)
    assert again.index.load_filter(again._filter_progress).count == filt.count
    messages = [r.getMessage() for r in package_logs]
    assert "key filter loaded" in messages
    assert "building the key filter from the index" not in messages
    again.index.close()
