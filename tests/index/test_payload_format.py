"""Index format 4 (compressed text payloads) decides exactly as formats 2 and 3 (stored
sets), and a format-2 index keeps opening, reading its records and deciding the same."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import keys
from stream_dedup.index.params import FORMAT_VERSION, IndexParams
from stream_dedup.index.records import decode_doc
from stream_dedup.index.store import DedupIndex
from stream_dedup.models import Document, Verdict
from stream_dedup.tools.generate import StreamSpec, generate
from tests.conftest import BackendFactory

CONFIG = DedupConfig()
#: SHA-256 of the verdict lines of :func:`stream` decided in batches of 500 by the release
#: whose index stored verification sets (format 2): 943 duplicates.
FORMAT_2_DIGEST = "d7765e78c0e85766907853eabfbfbe0a0e3625709798933c720fee5f6992f798"


def stream() -> list[Document]:
    return [
        Document(r["id"], r["title"] + "\n\n" + r["text"])
        for r in generate(StreamSpec(documents=3000, seed=11))
    ]


def digest(verdicts: Sequence[Verdict]) -> str:
    lines = "\n".join(
        json.dumps([v.id, v.is_duplicate, v.duplicate_of, v.similarity, v.cluster_id])
        for v in verdicts
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def decide(dedup: Deduplicator, docs: Sequence[Document], format_2: bool = False) -> list[Verdict]:
    """Verdicts of ``docs`` in batches of 500; ``format_2`` writes the records format 2
    wrote (the verification sets: a sketch without payloads stores them)."""
    out: list[Verdict] = []
    for i in range(0, len(docs), 500):
        batch = docs[i : i + 500]
        sk = dedup.sketch(batch)
        if format_2:
            sk = dataclasses.replace(sk, payloads=[])
        result = dedup.decide(batch, sk)
        dedup.commit(result)
        out += result.verdicts
    return out


def test_verdicts_equal_the_format_2_release(backend_factory: BackendFactory) -> None:
    backend = backend_factory()
    index = DedupIndex(backend, IndexParams.of(CONFIG))
    dedup = Deduplicator(index, CONFIG)
    verdicts = decide(dedup, stream())
    assert sum(v.is_duplicate for v in verdicts) == 943
    assert digest(verdicts) == FORMAT_2_DIGEST
    assert dedup.set_cache.asked > 0  # candidates' sets came through the cache
    raw = dict(backend.scan_prefix(keys.DOC))
    assert raw and all(decode_doc(v).text for v in raw.values())


def test_a_format_2_index_opens_and_decides_the_same(backend_factory: BackendFactory) -> None:
    docs = stream()
    backend = backend_factory()
    old_params = dataclasses.replace(IndexParams.of(CONFIG), format_version=2)
    old = DedupIndex(backend, old_params)
    first = decide(Deduplicator(old, CONFIG), docs[:1500], format_2=True)
    backend.write({keys.META: old_params.to_bytes()})  # as the format-2 release left it
    old_records = dict(backend.scan_prefix(keys.DOC))
    assert old_records and not any(decode_doc(v).text for v in old_records.values())

    reopened = DedupIndex(backend, IndexParams.of(CONFIG))  # format 4 opens format 2
    assert reopened.stats().params.format_version == 2  # as stored, until the first commit
    dedup = Deduplicator(reopened, CONFIG)
    dedup.set_cache.max_bytes = 0  # every text candidate's set rebuilt from its record
    rest = decide(dedup, docs[1500:])
    assert digest(first + rest) == FORMAT_2_DIGEST
    assert dedup.set_cache.rebuilt == dedup.set_cache.asked > 0  # new records were too
    assert reopened.stats().params.format_version == FORMAT_VERSION  # stored at its first commit
    assert IndexParams.from_bytes(backend.get_many([keys.META])[0] or b"") == IndexParams.of(CONFIG)
    records = dict(backend.scan_prefix(keys.DOC))
    assert {k: records[k] for k in old_records} == old_records  # old records untouched
    assert any(decode_doc(v).text for v in records.values())
