"""LSH banding: choosing bands and rows, and turning signatures into band keys.

A pair with Jaccard s becomes a candidate when at least one of b bands of r rows agrees
completely: ``P(s) = 1 - (1 - s**r)**b`` (the S-curve). Because every candidate is verified
before a verdict, a false candidate costs only a little work, while a missed candidate is
a missed duplicate that nothing can recover. So the criterion puts recall at the
threshold first:

1. Use whole bands only: for r rows, b = floor(K / r) (more bands only raise the curve).
2. Among those, take the largest r whose ``P(T) >= recall_at_threshold`` (default 0.95):
   the steepest curve that still catches a pair at exactly J = T with that probability,
   so pairs far below T become candidates as rarely as the constraint allows.

datasketch instead minimises a weighted sum of the areas under and over the curve, which
for T = 0.8, K = 128 picks b = 9, r = 13 and catches a pair at J = 0.8 with probability
0.40; our rule picks b = 18, r = 7 with P(0.8) = 0.986 and P(0.5) = 0.13.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream_dedup.core import _kernels, jit
from stream_dedup.core.config import DEFAULT_RECALL_AT_THRESHOLD
from stream_dedup.core.hashing import POLY, U32, U64, fmix64, mix_seed

_SALT_BAND = 0x42414E44


def candidate_probability(s: float, bands: int, rows: int) -> float:
    """Probability that a pair with Jaccard ``s`` shares at least one band."""
    return float(1.0 - (1.0 - s**rows) ** bands)


@dataclass(frozen=True, slots=True)
class BandPlan:
    """A chosen (bands, rows) split of ``num_perm`` signature values."""

    bands: int
    rows: int
    num_perm: int
    threshold: float

    @property
    def unused(self) -> int:
        """Signature values left out of every band (computed but not used for lookups)."""
        return self.num_perm - self.bands * self.rows

    @property
    def knee(self) -> float:
        """Similarity where the S-curve is steepest, approximately ``(1/b) ** (1/r)``."""
        return float((1.0 / self.bands) ** (1.0 / self.rows))

    def probability(self, s: float) -> float:
        return candidate_probability(s, self.bands, self.rows)


def choose_bands(
    threshold: float,
    num_perm: int,
    recall_at_threshold: float = DEFAULT_RECALL_AT_THRESHOLD,
) -> BandPlan:
    """Choose (b, r) by the criterion in the module docstring.

    Raises ``ValueError`` when even r = 1 (every value its own band) cannot reach the
    requested probability, i.e. the threshold is too low for ``num_perm`` values.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], not {threshold}")
    if not 0.0 < recall_at_threshold < 1.0:
        raise ValueError(f"recall at threshold must be in (0, 1), not {recall_at_threshold}")
    if num_perm < 1:
        raise ValueError(f"num_perm must be positive, not {num_perm}")
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if candidate_probability(threshold, bands, rows) >= recall_at_threshold:
            return BandPlan(bands, rows, num_perm, threshold)
    raise ValueError(
        f"no (bands, rows) with {num_perm} hash values reaches P(candidate) >= "
        f"{recall_at_threshold} at similarity {threshold}: raise --num-perm or the threshold"
    )


def explicit_bands(bands: int, rows: int, num_perm: int, threshold: float) -> BandPlan:
    """Validate an explicit ``--bands/--rows`` override."""
    if bands < 1 or rows < 1:
        raise ValueError(f"bands and rows must be positive, not {bands} x {rows}")
    if bands * rows > num_perm:
        raise ValueError(f"bands x rows = {bands * rows} exceeds num_perm = {num_perm}")
    if bands > 0xFFFF:
        raise ValueError(f"at most 65535 bands, not {bands}")
    return BandPlan(bands, rows, num_perm, threshold)


def band_hashes(sigs: U32, plan: BandPlan, seed: int) -> U64:
    """``(n_docs, bands)`` uint64: a seeded hash of each band's r signature values.

    The compiled kernel (:func:`._kernels.band_hash_rows`) gives the same numbers in one
    loop; the numpy form serves when numba is not loaded (a small batch, a short command).
    """
    n = sigs.shape[0]
    acc = np.empty((n, plan.bands), dtype=np.uint64)
    if jit.runs_compiled(documents=n):
        rows_of = jit.compiled(_kernels.band_hash_rows)
        rows_of(sigs, plan.rows, mix_seed(seed, _SALT_BAND), POLY, acc)
        return acc
    acc[:] = mix_seed(seed, _SALT_BAND)
    acc += np.arange(plan.bands, dtype=np.uint64)[None, :]
    used = sigs[:, : plan.bands * plan.rows].astype(np.uint64).reshape(n, plan.bands, plan.rows)
    for j in range(plan.rows):
        acc *= POLY
        acc += used[:, :, j]
        fmix64(acc)
    return acc


def similarity_table(
    plan: BandPlan, points: npt.ArrayLike | None = None
) -> list[tuple[float, float]]:
    """``(s, P(candidate))`` rows for the tune report."""
    grid = np.asarray(points if points is not None else np.round(np.arange(0.1, 1.0001, 0.05), 2))
    return [(float(s), plan.probability(float(s))) for s in grid]


def datasketch_choice(threshold: float, num_perm: int) -> BandPlan:
    """What datasketch's ``MinHashLSH`` would pick (equal false-positive/negative weights).

    It minimises the area under the S-curve below T plus the area above it beyond T. Shown
    by ``tune`` for comparison: for T = 0.8, K = 128 it yields b = 9, r = 13, P(T) = 0.40.
    """

    def area(lo: float, hi: float, bands: int, rows: int, above: bool) -> float:
        s = np.linspace(lo, hi, 401)
        p = 1.0 - (1.0 - s**rows) ** bands
        y = 1.0 - p if above else p
        return float(np.sum((y[1:] + y[:-1]) * np.diff(s)) / 2.0)

    best: tuple[float, int, int] | None = None
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            err = 0.5 * area(0.0, threshold, bands, rows, False) + 0.5 * area(
                threshold, 1.0, bands, rows, True
            )
            if best is None or err < best[0]:
                best = (err, bands, rows)
    assert best is not None
    return BandPlan(best[1], best[2], num_perm, threshold)
