"""Two source trees' shared-index setups, paired: 1 and 2 instances, the group order on/off.

``bench_shared.py`` measures setups within one tree; a change to the shared index's
service path is judged against the tree before it the way ``pair_trees.py`` judges the
single-instance service: this script runs ``bench_shared.py --repeats 1`` from each tree
in turn (its working directory and first on ``PYTHONPATH``, so the instances it starts
run that tree's code), the order of the trees flipped every round, and prints each
setup's runs and medians per tree, with the load average and the share of the
machine's CPUs busy during each run (the machine is shared: read medians).

    .venv/bin/python bench/pair_shared.py /tmp/old-tree . --rounds 3 -n 12000
    .venv/bin/python bench/pair_shared.py /tmp/old-tree . --setups "redis cluster"

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
from typing import Any

BENCH = Path(__file__).resolve().parent / "bench_shared.py"


def one_round(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of every chosen setup from ``tree``: bench_shared.py's JSON results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run(
            [sys.executable, str(BENCH), "-n", str(args.documents), "--repeats", "1",
             "--setups", args.setups, "--no-peer", "--json", str(out)],
            cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", type=Path, help="the tree compared against")
    p.add_argument("candidate", type=Path, help="the tree measured")
    p.add_argument("-n", "--documents", type=int, default=12_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--setups", default="redis node", help="bench_shared.py's --setups")
    p.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    args = p.parse_args()
    trees = (args.baseline.resolve(), args.candidate.resolve())
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {t.name: {} for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            load = os.getloadavg()[0]
            result = one_round(tree, args)
            for name, value in result.items():
                if not isinstance(value, dict) or "docs_per_s" not in value:
                    continue
                rate, busy = value["docs_per_s"][0], value["host_busy_share"][0]
                runs[tree.name].setdefault(name, []).append((rate, busy))
                print(
                    f"round {r + 1} {tree.name} {name}: {rate:,.0f} docs/s, CPUs busy "
                    f"{100 * busy:.0f}% (load {load:.1f} at start)",
                    flush=True,
                )
    base, cand = (runs[t.name] for t in trees)
    for name in base:
        b = statistics.median(x for x, _ in base[name])
        c = statistics.median(x for x, _ in cand.get(name, [(0.0, 0.0)]))
        print(f"{name}: baseline median {b:,.0f} docs/s, candidate {c:,.0f} ({c / b:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
