"""The ``tune`` report: which (bands, rows) serve a threshold, and the S-curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stream_dedup.core.bands import BandPlan, similarity_table
from stream_dedup.errors import StreamDedupError


def render_report(plan: BandPlan, recall_at_threshold: float, explicit: bool) -> str:
    """A plain-text report of the plan, its S-curve at a table of similarities."""
    how = (
        "explicit --bands/--rows"
        if explicit
        else f"largest r with b = floor(K/r) and P(candidate | J = T) >= {recall_at_threshold}"
    )
    lines = [
        f"threshold T        {plan.threshold}",
        f"num_perm K         {plan.num_perm}",
        f"bands b            {plan.bands}",
        f"rows r             {plan.rows}",
        f"criterion          {how}",
        f"P(candidate | T)   {plan.probability(plan.threshold):.4f}",
        f"S-curve knee       {plan.knee:.3f}  ((1/b)^(1/r): the curve is steepest here)",
        f"unused hashes      {plan.unused}",
        "",
        "similarity  P(candidate)",
    ]
    points = sorted({*np.round(np.arange(0.1, 1.0001, 0.1), 2).tolist(), plan.threshold})
    for s, p in similarity_table(plan, points):
        mark = "  <- threshold" if abs(s - plan.threshold) < 1e-9 else ""
        lines.append(f"{s:10.2f}  {p:12.4f}{mark}")
    return "\n".join(lines)


def plot_s_curve(plan: BandPlan, path: str | Path, compare: BandPlan | None = None) -> None:
    """Draw P(candidate) against Jaccard similarity to a PNG (needs the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise StreamDedupError(
            "plotting needs matplotlib: pip install 'stream-dedup[plot]'"
        ) from exc
    s = np.linspace(0.0, 1.0, 201)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    ax.plot(s, 1 - (1 - s**plan.rows) ** plan.bands, label=f"b={plan.bands}, r={plan.rows}")
    if compare is not None:
        ax.plot(
            s,
            1 - (1 - s**compare.rows) ** compare.bands,
            linestyle="--",
            label=f"b={compare.bands}, r={compare.rows} (datasketch's choice)",
        )
    ax.axvline(plan.threshold, color="grey", linestyle=":", label=f"threshold {plan.threshold}")
    ax.axhline(plan.probability(plan.threshold), color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("Jaccard similarity of a pair")
    ax.set_ylabel("P(pair becomes a candidate)")
    ax.set_title(f"LSH S-curve, K={plan.num_perm}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
