"""``--verify signature``: candidates verified by the signature estimate, not exactly.

The estimate of a pair at Jaccard J has a standard deviation near
``sqrt(J (1 - J) / K)`` (0.035 at J = 0.8, K = 128), so documents whose best earlier match
lies within a few of those of T fall on either side by chance; signature mode cannot
reach exact mode's figures where a corpus has many such documents. The sharp checks are
therefore taken outside that noise band, ``T -/+ 3 sigma``, where the estimate decides
like the exact value, and hold the issue's targets there (precision 0.99, recall 0.98).
The raw figures at T only get a sanity floor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from stream_dedup.core.config import DedupConfig

pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from conftest import GroundTruth, RunOffline

RAW_FLOOR = 0.90
MIN_PRECISION = 0.99
MIN_RECALL = 0.98


def noise_band(threshold: float) -> tuple[float, float]:
    sigma = math.sqrt(threshold * (1.0 - threshold) / DedupConfig().num_perm)
    return threshold - 3.0 * sigma, threshold + 3.0 * sigma


def test_raw_precision_and_recall(truth: GroundTruth, run_offline: RunOffline) -> None:
    measured = truth.quality(run_offline(truth, "signature"), "signature")
    print(f"\n{measured}")
    assert measured.precision >= RAW_FLOOR, str(measured)
    assert measured.recall >= RAW_FLOOR, str(measured)


def test_exact_outside_the_noise_band(truth: GroundTruth, run_offline: RunOffline) -> None:
    """Matches are never far below T; clear duplicates (far above T) are found."""
    verdicts = run_offline(truth, "signature")
    low, high = noise_band(truth.threshold)
    position = {doc_id: n for n, doc_id in enumerate(truth.corpus.ids)}
    flagged = [n for n, v in enumerate(verdicts) if v["verdict"] == "duplicate"]
    far_below = [
        n for n in flagged if truth.pair_jaccard(n, position[verdicts[n]["duplicate_of"]]) < low
    ]
    clear = [n for n, best in enumerate(truth.best_earlier) if best >= high]
    found = sum(verdicts[n]["verdict"] == "duplicate" for n in clear)
    precision = 1.0 - len(far_below) / len(flagged) if flagged else 1.0
    recall = found / len(clear) if clear else 1.0
    report = (
        f"{truth.name}/signature, band [{low:.3f}, {high:.3f}]: {len(far_below)} of "
        f"{len(flagged)} matches below the band (precision {precision:.4f}); {found} of "
        f"{len(clear)} documents above it flagged (recall {recall:.4f})"
    )
    print(f"\n{report}")
    assert precision >= MIN_PRECISION, report
    assert recall >= MIN_RECALL, report
