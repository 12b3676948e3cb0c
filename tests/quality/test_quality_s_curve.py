"""The S-curve is honest: pairs at and above T share an LSH band as often as promised.

``tune`` and the band choice promise ``P(candidate | J) = 1 - (1 - J**r)**b``. Over the
ground-truth pairs of both corpora (every pair with exact Jaccard >= 0.3), bucketed by
exact Jaccard, the share of pairs whose package signatures share at least one band must
not fall below the curve at the bucket's lower edge by more than ``Z`` binomial standard
errors of the bucket's count. Buckets below T are printed only: there a shortfall costs
nothing and an excess costs verification work, not quality. (Texts of fewer shingles
than K = 128 exceed the curve below T: densified bins copy each other, so their rows
agree together.)
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pytest

pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from conftest import GroundTruth

Z = 3.0
EDGES = tuple(round(0.3 + 0.05 * i, 2) for i in range(15))  # 0.30, 0.35, ..., 1.00
MIN_PAIRS_AT_T = 100


def test_candidate_rate_meets_the_s_curve(truths: dict[str, GroundTruth]) -> None:
    first = next(iter(truths.values()))
    plan, threshold = first.config.band_plan(), first.threshold
    jaccard = np.concatenate([t.jaccard for t in truths.values()])
    shared = np.concatenate([t.band_shared() for t in truths.values()])

    lines = [f"S-curve b={plan.bands} r={plan.rows} over the pairs of {', '.join(truths)}:"]
    short, pairs_at_t = [], 0
    for low, high in pairwise(EDGES):
        last = high == EDGES[-1]
        inside = (jaccard >= low) & ((jaccard <= high) if last else (jaccard < high))
        n = int(inside.sum())
        if n == 0:
            continue
        rate = float(shared[inside].mean())
        p = plan.probability(low)
        line = (
            f"  J in [{low:.2f}, {high:.2f}{']' if last else ')'}: {n:6d} pairs, "
            f"share a band {rate:.4f}, P({low:.2f}) = {p:.4f}"
        )
        if low >= threshold:
            bound = p - Z * math.sqrt(p * (1.0 - p) / n)
            line += f", bound {bound:.4f}"
            if rate < bound:
                short.append(line)
            if low == threshold:
                pairs_at_t = n
        lines.append(line)
    report = "\n".join(lines)
    print(f"\n{report}")
    assert pairs_at_t >= MIN_PAIRS_AT_T, f"too few pairs at T to test the curve\n{report}"
    assert not short, f"candidate rate below the S-curve:\n{report}"
