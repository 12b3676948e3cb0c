"""The compiled matching pass against a plain per-document model of the decision rules.

The model decides one document at a time with dicts and lists: buckets as lists of docnums
(newest ``max_bucket_size`` kept), candidates ranked by shared bands then docnum, exact
Jaccard (or the signature estimate) of every ranked candidate, the most similar match at or
above the threshold with ties to the earliest. The deduplicator must give the same verdicts
and the same candidate and verification counts, whatever the batch size, on the real ads
with exact copies, repeated ids and empty texts mixed in, with the bounds set low enough
that buckets evict and candidate lists are cut.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.signature import estimate_jaccard
from stream_dedup.core.sketch import sketch
from stream_dedup.core.verify import exact_jaccard
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document

#: (id, verdict, duplicate_of, similarity, cluster_id, empty, replayed, candidates, verified)
Row = tuple[str, str, str | None, float | None, str, bool, bool, int, int]


def model(docs: list[Document], config: DedupConfig) -> list[Row]:
    """Every document's verdict and work, decided one at a time by the rules alone."""
    plan = config.band_plan()
    sk = sketch([d.content for d in docs], config, plan)
    exact_verify = config.verify == "exact"
    live_pos = {doc_index: p for p, doc_index in enumerate(sk.live)}
    buckets: dict[bytes, list[int]] = {}
    texts: dict[bytes, int] = {}
    payload: dict[int, np.ndarray] = {}
    who: dict[int, tuple[str, str]] = {}
    decided: dict[tuple[str, bytes], Row] = {}  # (id, text): each revision's row
    rows: list[Row] = []
    for i, doc in enumerate(docs):
        p = live_pos.get(i)
        revision = (doc.id, b"" if p is None else sk.exact_keys[p])
        if revision in decided:  # the same id with the same text: a replay
            rows.append((*decided[revision][:6], True, 0, 0))
            continue
        if p is None:
            row: Row = (doc.id, "unique", None, None, doc.id, True, False, 0, 0)
        else:
            mine = sk.sets[p] if exact_verify else sk.sigs[p]
            text, bands = sk.exact_keys[p], sk.bucket_keys[p * plan.bands : (p + 1) * plan.bands]
            found: tuple[float, int] | None = None
            if text in texts:
                found, n_cand, n_ver = (1.0, texts[text]), 1, 0
            else:
                shared = Counter(m for key in bands for m in buckets.get(key, []))
                ranked = sorted(shared, key=lambda m: (-shared[m], m))[: config.max_candidates]
                n_cand, n_ver = len(shared), len(ranked)
                for m in ranked:
                    sim = (
                        exact_jaccard(mine, payload[m])
                        if exact_verify
                        else estimate_jaccard(mine, payload[m])
                    )
                    if sim >= config.threshold and (
                        found is None or (sim, -m) > (found[0], -found[1])
                    ):
                        found = (sim, m)
            if found is None:
                row = (doc.id, "unique", None, None, doc.id, False, False, n_cand, n_ver)
            else:
                of, cluster = who[found[1]]
                sim = round(found[0], 6)
                row = (doc.id, "duplicate", of, sim, cluster, False, False, n_cand, n_ver)
            if config.index_policy == "all" or found is None:
                num = len(payload)
                payload[num], who[num] = mine, (doc.id, row[4])
                texts.setdefault(text, num)
                for key in bands:
                    buckets[key] = [*buckets.get(key, []), num][-config.max_bucket_size :]
        decided[revision] = row  # another text under a known id: decided as a revision
        rows.append(row)
    return rows


def stream(ads: list[tuple[str, str]], n: int, seed: int) -> list[Document]:
    """The first ``n`` ads, with exact copies, repeated ids and empty texts mixed in."""
    rng = random.Random(seed)
    out: list[Document] = []
    for ad_id, content in ads[:n]:
        out.append(Document(ad_id, content))
        r = rng.random()
        if r < 0.03:
            out.append(Document(ad_id, content))  # the same id again
        elif r < 0.05:
            out.append(Document(ad_id + "-empty", " \n "))
        elif r < 0.10:
            out.append(Document(ad_id + "-copy", content))
        elif r < 0.12:
            earlier = out[rng.randrange(len(out))]
            out.append(Document(earlier.id, "another text under an id seen before"))
    return out


def decided(docs: list[Document], config: DedupConfig, backend: Backend, batch: int) -> list[Row]:
    dedup = Deduplicator(DedupIndex(backend, IndexParams.of(config)), config)
    rows: list[Row] = []
    for lo in range(0, len(docs), batch):
        result = dedup.process(docs[lo : lo + batch])
        for v, c, n in zip(
            result.verdicts, result.stats.candidates, result.stats.verifications, strict=True
        ):
            rows.append(
                (v.id, v.verdict.value, v.duplicate_of, v.similarity, v.cluster_id, v.empty,
                 v.replayed, c, n)
            )  # fmt: skip
    return rows


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"max_bucket_size": 2, "max_candidates": 1},
        {"max_bucket_size": 3, "max_candidates": 2, "threshold": 0.4, "index_policy": "uniques"},
        {"verify": "signature", "max_bucket_size": 4, "max_candidates": 3, "threshold": 0.5},
    ],
    ids=["defaults", "tiny-bounds", "uniques", "signature"],
)
@pytest.mark.slow
def test_matching_pass_equals_the_per_document_model(
    kijiji_ads: list[tuple[str, str]],
    backend_factory: Callable[[], Backend],
    backend_kind: str,
    overrides: dict[str, object],
) -> None:
    config = DedupConfig(**overrides)  # type: ignore[arg-type]
    docs = stream(kijiji_ads, 900, seed=len(overrides))
    want = model(docs, config)
    duplicates = sum(r[1] == "duplicate" for r in want)
    assert duplicates > 150, "the stream must exercise matching"
    assert sum(r[6] for r in want) > 20, "and replays"
    if overrides:
        assert sum(r[7] > config.max_candidates for r in want) > 10, "and cut candidate lists"
    # One document per batch is a round trip per document on Redis: that the batch size
    # changes nothing is the deduplicator's property, checked on the fast backends.
    sizes = (1, 128, len(docs)) if backend_kind in ("memory", "rocks") else (128, len(docs))
    for batch in sizes:
        assert decided(docs, config, backend_factory(), batch) == want, f"batch size {batch}"
