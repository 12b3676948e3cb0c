"""Two settings of one service benchmark side by side: medians and their ratios.

``bench_service.py --containment 0,0.8`` runs the two settings alternately in each repeat;
this prints what the comparison needs, by rate and by the service's own CPU (steadier
than the rate on a shared host).
"""

from __future__ import annotations

import statistics


def compare(
    settings: list[float], by_setting: dict[float, list[tuple[float, dict[str, float | None]]]]
) -> None:
    """Each setting's median rate and service CPU per document (its loop, other threads
    and sketch worker), and the ratios of the second to the first, by rate and by CPU."""
    med: dict[float, tuple[float, float]] = {}
    for c in settings:
        runs = by_setting[c]
        cpu = [
            sum(v or 0.0 for k, v in parts.items() if k not in ("broker", "benchmark"))
            for _, parts in runs
        ]
        med[c] = (statistics.median(r for r, _ in runs), statistics.median(cpu))
        print(
            f"containment {c}: median {med[c][0]:,.0f} docs/s, service CPU "
            f"{med[c][1]:.0f} us/doc (runs: " + ", ".join(f"{r:,.0f}" for r, _ in runs) + ")"
        )
    (a_rate, a_cpu), (b_rate, b_cpu) = med[settings[0]], med[settings[1]]
    paired = statistics.median(
        b[0] / a[0] for a, b in zip(by_setting[settings[0]], by_setting[settings[1]], strict=True)
    )
    print(
        f"containment {settings[1]} vs {settings[0]}: rate ratio of medians "
        f"{b_rate / a_rate:.2f}, paired median {paired:.2f}; by service CPU "
        f"{a_cpu / b_cpu:.2f}"
    )
