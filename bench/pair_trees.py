"""Two source trees' service throughput, paired: which code is faster on this host now.

A change's cost against an earlier release (an index format, say) is measured by running
``bench_service.py``'s throughput phase on each tree in turn, the order flipped every
round, and comparing medians: the ratio of the median rates, the median of the rounds'
ratios, and the service's CPU per document (its loop, other threads and sketch worker),
the steadier figure on a shared host. Each run starts in its tree as the working
directory with that tree first on ``PYTHONPATH``: the service is started with ``python
-m``, which puts the working directory first, so the tree the run starts in is the code
that runs. This script's own ``bench_service.py`` drives both trees.

    .venv/bin/python bench/pair_trees.py /tmp/old-tree . --rounds 6 -n 30000

An older tree is made with ``git archive <commit> | tar -x -C /tmp/old-tree``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "bench_service.py"


def one_run(tree: Path, documents: int) -> tuple[float, float]:
    """One throughput run of ``tree``: docs/s and the service's CPU µs per document."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run(
            [sys.executable, str(BENCH), "-n", str(documents), "--repeats", "1",
             "--skip-latency", "--json", str(out)],
            cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        result = json.loads(out.read_text(encoding="utf-8"))
    parts = result["throughput_cpu_us_per_document"][0]
    cpu = sum(v or 0.0 for k, v in parts.items() if k not in ("broker", "benchmark"))
    return float(result["throughput_docs_per_s"][0]), cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", type=Path, help="the tree compared against")
    p.add_argument("candidate", type=Path, help="the tree measured")
    p.add_argument("-n", "--documents", type=int, default=30_000)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    trees = (args.baseline.resolve(), args.candidate.resolve())
    runs: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            rate, cpu = one_run(tree, args.documents)
            runs[tree].append((rate, cpu))
            load = os.getloadavg()[0]
            print(f"round {r + 1} {tree.name}: {rate:,.0f} docs/s, {cpu:.0f} us/doc (load {load})")
    (base, cand) = (runs[t] for t in trees)
    rate_b, rate_c = statistics.median(x for x, _ in base), statistics.median(x for x, _ in cand)
    cpu_b, cpu_c = statistics.median(c for _, c in base), statistics.median(c for _, c in cand)
    paired = statistics.median(c[0] / b[0] for b, c in zip(base, cand, strict=True))
    print(
        f"baseline {rate_b:,.0f} docs/s, {cpu_b:.0f} us/doc; candidate {rate_c:,.0f} docs/s, "
        f"{cpu_c:.0f} us/doc; rate ratio of medians {rate_c / rate_b:.2f}, paired median "
        f"{paired:.2f}, by service CPU {cpu_b / cpu_c:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
