"""Candidate generation for excerpts, measured: consistent hash sampling against
size-partitioned MinHash LSH at a lowered threshold (LSH Ensemble's way).

The stream is ``tests/excerpts.py``'s (news stories, re-runs, excerpts under their own
header and footer), with its exact containment truth. For every document D with an
earlier document E of containment ``|D ∩ E| / |D| >= C``, a method *finds* D when a
document of containment >= C is among the candidates it would verify.

(a) sampling: every verification value v (a shingle hash's high 32 bits) whose mixed
    hash has its low ``log2 M`` bits zero is a key; a stored document's sampled keys
    hold it (a bucket stops growing at ``cap`` members, and a full bucket does not
    vote: the hash is common); D's candidates are the earlier documents sharing
    >= ``m`` of its voting keys, most shared first, the first ``verify`` of them.
(b) LSH Ensemble: the index is partitioned by set size (equal-depth, 4 partitions);
    a query of size q looks in a partition with upper bound u at the Jaccard threshold
    ``C q / (q + u - C q)`` with the bands and rows the package tunes for it. Its
    recall and candidates are the S-curve's expectation over the exact Jaccard of every
    pair (``1 - (1 - J^r)^b``), and its keys per document the bands of the lowest
    threshold any query uses.

    python bench/containment_candidates.py --documents 4000
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from stream_dedup.core.bands import choose_bands
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.containment import sampled
from stream_dedup.core.sketch import sketch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the excerpt stream of tests/
from tests.excerpts import ContainmentTruth, containment_truth, excerpt_stream

CONTAINMENT = 0.8


def sampling(
    sets: list[np.ndarray], truth: ContainmentTruth, rate: int, cap: int, m: int, verify: int
) -> dict[str, float]:
    """Recall, candidates, keys per document and time of hash sampling at 1/``rate``."""
    buckets: dict[int, list[int]] = defaultdict(list)
    want = truth.best >= CONTAINMENT
    found = candidates = keys = 0
    started = time.perf_counter()
    for d, values in enumerate(sets):
        keys_d = sampled(values, rate, 1).tolist()
        keys += len(keys_d)
        votes: dict[int, int] = defaultdict(int)
        for k in keys_d:
            members = buckets.get(k)
            if members is None or len(members) >= cap:
                continue
            for e in members:
                votes[e] += 1
        chosen = sorted((e for e, n in votes.items() if n >= m), key=lambda e: (-votes[e], e))
        chosen = chosen[:verify]
        candidates += len(chosen)
        if want[d] and any(truth.containment[d, e] >= CONTAINMENT for e in chosen):
            found += 1
        for k in keys_d:
            members = buckets[k]
            if len(members) < cap:
                members.append(d)
    took = time.perf_counter() - started
    return {
        "recall": found / max(int(want.sum()), 1),
        "candidates_per_doc": candidates / len(sets),
        "keys_per_doc": keys / len(sets),
        "seconds": took,
    }


def ensemble(truth: ContainmentTruth, partitions: int = 4) -> dict[str, float]:
    """LSH Ensemble's expected recall and candidates (see the module docstring)."""
    sizes = truth.sizes.astype(np.float64)
    bounds = np.quantile(sizes, np.linspace(0, 1, partitions + 1)[1:])
    part = np.searchsorted(bounds, sizes)
    want = truth.best >= CONTAINMENT
    plans: dict[float, tuple[int, int]] = {}
    recall_sum = cand_sum = 0.0
    lowest = 1.0
    for d in range(len(sizes)):
        q = sizes[d]
        u = bounds[part[: d + 1]][:d] if d else np.empty(0)
        if not d:
            continue
        j = np.round(CONTAINMENT * q / (q + u - CONTAINMENT * q), 2).clip(0.05, 1.0)
        lowest = min(lowest, float(j.min()))
        prob = np.empty(d)
        for jv in np.unique(j):
            if jv not in plans:
                plan = choose_bands(float(jv), 128, 0.95)
                plans[jv] = (plan.bands, plan.rows)
            b, r = plans[jv]
            sel = j == jv
            prob[sel] = 1 - (1 - truth.jaccard[d, :d][sel] ** r) ** b
        cand_sum += float(prob.sum())
        if want[d]:
            hit = truth.containment[d, :d] >= CONTAINMENT
            recall_sum += 1 - float(np.prod(1 - prob[hit]))
    low_plan = choose_bands(round(lowest, 2), 128, 0.95)
    return {
        "recall": recall_sum / max(int(want.sum()), 1),
        "candidates_per_doc": cand_sum / len(sizes),
        "keys_per_doc": float(low_plan.bands),
        "lowest_threshold": lowest,
    }


def s_curve(contents: list[str], ids: list[str], truth: ContainmentTruth) -> None:
    """Share of documents flagged (duplicate, by either relation) per band of their true
    best containment, among those whose Jaccard with every earlier one is below T: the
    containment rule's S-curve as the detector runs it (batches of 1,000, memory index)."""
    from stream_dedup.api import Detector

    with Detector(containment=CONTAINMENT) as det:
        verdicts = det.add_many(list(zip(ids, contents, strict=True)))
    dup = np.array([v.is_duplicate for v in verdicts])
    below = truth.best_jaccard < 0.8
    edges = [0.0, 0.5, 0.6, 0.7, 0.75, 0.78, 0.8, 0.82, 0.85, 0.9, 1.01]
    print("true containment band: documents (Jaccard < 0.8), share flagged")
    for lo, hi in itertools.pairwise(edges):
        sel = below & (truth.best >= lo) & (truth.best < hi)
        if sel.any():
            print(f"  [{lo:.2f}, {min(hi, 1.0):.2f}): {int(sel.sum()):5d}, {dup[sel].mean():.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=4000)
    parser.add_argument("--s-curve", action="store_true", help="only the detector's S-curve")
    args = parser.parse_args()
    stream = excerpt_stream(args.documents)
    truth = containment_truth(stream.contents)
    if args.s_curve:
        s_curve(stream.contents, [r["id"] for r in stream.records], truth)
        return
    config = DedupConfig()
    sk = sketch(stream.contents, config, config.band_plan())
    sets = sk.sets
    print(f"{args.documents} documents, {int((truth.best >= CONTAINMENT).sum())} with C >= 0.8")
    print("(b) LSH Ensemble, 4 partitions:", ensemble(truth))
    for rate in (8, 16, 32):
        for cap in (32, 64):
            for m in (2, 3):
                got = sampling(sets, truth, rate, cap, m, verify=20)
                row = " ".join(f"{k} {v:.3f}" for k, v in got.items())
                print(f"(a) rate 1/{rate} cap {cap} m {m}: {row}")


if __name__ == "__main__":
    main()
