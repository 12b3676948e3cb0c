"""Containment through the running service: excerpts found over a real broker and RocksDB,
their events equal to the offline ``dedup --containment`` run's verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.excerpts import excerpt_stream

from .support import (
    ServiceThread,
    Topics,
    events,
    make_config,
    offline_reference,
    produce_json,
    read_topic,
)

pytestmark = pytest.mark.broker

#: Every field containment decides or adds, compared with the offline run's.
FIELDS = ("verdict", "duplicate_of", "similarity", "cluster_id", "relation", "containment")


def _stories(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each record's story: an excerpt's is that of the original it was cut from."""
    story: dict[str, str] = {}
    for r in records:
        story[r["id"]] = story[r["source"]] if r["kind"] == "excerpt" else r["source"]
    return story


def test_excerpt_events_through_kafka_equal_the_offline_run(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    docs = excerpt_stream(1000).records
    reference = offline_reference(docs, tmp_path, "--containment", "0.8")
    produce_json(bootstrap, topics.input, docs)
    config = make_config(bootstrap, topics, tmp_path / "index", dedup={"containment": 0.8})
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs))
    assert svc.stop() == 0  # the last batch committed: every excerpt counted
    excerpts_counted = svc.metric("stream_dedup_excerpts_total")

    uniques = read_topic(bootstrap, topics.unique, 1, timeout_s=10)
    duplicates = read_topic(bootstrap, topics.duplicates, 1, timeout_s=10)
    got = {e["id"]: e for e in events(uniques + duplicates)}
    assert len(got) == len(docs) == len(uniques) + len(duplicates)
    for doc in docs:
        ev, ref = got[doc["id"]], reference[doc["id"]]
        assert {k: ev.get(k) for k in FIELDS} == {k: ref.get(k) for k in FIELDS}, doc["id"]
        assert ev.get("contains") == ref.get("contains"), doc["id"]
    found = [e for e in got.values() if e.get("relation") == "excerpt"]
    cut = [d for d in docs if d["kind"] == "excerpt"]
    assert len(found) == excerpts_counted
    assert len(found) >= 0.9 * len(cut) > 60
    assert all(e["containment"] >= 0.8 > e["similarity"] for e in found)
    assert all(e["verdict"] == "duplicate" for e in found)
    # The named source tells the story the excerpt was cut from (the original, or a
    # re-run of it holding the same block).
    story = _stories(docs)
    named = [story[e["id"]] == story[e["duplicate_of"]] for e in found]
    assert sum(named) >= 0.95 * len(found)
    assert any("contains" in e for e in got.values() if e["verdict"] == "unique")
