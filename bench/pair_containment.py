"""Containment's cost in two source trees, paired: ``bench_containment.py``'s runs, alternated.

Each call runs, in a child process started in one tree with that tree first on
``PYTHONPATH``, ``--per-call`` rounds of that tree's own ``bench_containment.run`` on each
stream (containment off and on alternated as that script does) and prints every run as
a JSON line; calls alternate between the trees (A B, B A, ...). So both trees' runs
interleave over the whole measurement, the host's load falling on both alike. Reported
per tree and stream, whole run and after the dictionary's training: the ratio on/off by
the medians of the process's CPU per document, the median of the rounds' paired rate
ratios, and the ratio of the median rates; with the load average at the calls' starts.

    .venv/bin/python bench/pair_containment.py /tmp/old-tree . --rounds 15 --per-call 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def one_call(tree: str, documents: int, rounds: int, streams: str, batch: int) -> None:
    """In this process: ``rounds`` alternated runs per stream of ``tree``'s benchmark."""
    sys.path[:0] = [tree, str(Path(tree) / "bench")]
    import tempfile

    import bench_containment as bc

    for stream in streams.split(","):
        docs = bc.documents(stream, documents)
        bc.run(docs[:2000], 0.8, batch, Path(tempfile.mkdtemp()) / "warm")  # kernels loaded
        for r in range(rounds):
            for c in (0.0, 0.8) if r % 2 == 0 else (0.8, 0.0):
                with tempfile.TemporaryDirectory() as tmp:
                    got = bc.run(docs, c, batch, Path(tmp) / "idx")
                row = {"stream": stream, "c": c, "docs": len(docs), **got._asdict()}
                print(json.dumps(row), flush=True)


def ratios(rows: list[dict[str, Any]], steady: bool) -> str:
    """On/off by CPU, paired median and ratio of median rates for one tree and stream."""
    wall, cpu, docs = ("steady_wall", "steady_cpu", "steady_docs") if steady else (
        "wall", "cpu", "docs")  # fmt: skip
    off = [r for r in rows if r["c"] == 0.0]
    on = [r for r in rows if r["c"] != 0.0]
    rate = [[r[docs] / r[wall] for r in arm] for arm in (off, on)]
    us = [statistics.median(r[cpu] / r[docs] * 1e6 for r in arm) for arm in (off, on)]
    paired = statistics.median(b / a for a, b in zip(rate[0], rate[1], strict=True))
    by_rates = statistics.median(rate[1]) / statistics.median(rate[0])
    return (
        f"CPU/doc off {us[0]:.0f} us, on {us[1]:.0f} us: by CPU {us[0] / us[1]:.2f}, "
        f"paired {paired:.2f}, ratio of medians {by_rates:.2f} ({len(on)} rounds)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", nargs="?", type=Path)
    p.add_argument("candidate", nargs="?", type=Path)
    p.add_argument("-n", "--documents", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=15, help="rounds per tree")
    p.add_argument("--per-call", type=int, default=5)
    p.add_argument("--streams", default="excerpts,news")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--json", type=Path, help="also write every run as a JSON line here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child's tree
    args = p.parse_args()
    if args.one:
        one_call(args.one, args.documents, args.per_call, args.streams, args.batch)
        return 0
    trees = (args.baseline.resolve(), args.candidate.resolve())
    rows: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    for call in range(-(-args.rounds // args.per_call)):
        for tree in trees if call % 2 == 0 else trees[::-1]:
            load = os.getloadavg()[0]
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(tree), "-n", str(args.documents),
                 "--per-call", str(args.per_call), "--streams", args.streams,
                 "--batch", str(args.batch)],
                cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), check=True,
                capture_output=True, text=True,
            ).stdout  # fmt: skip
            rows[tree] += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            print(f"call {call + 1} {tree}: load average {load:.1f} at the start", flush=True)
    if args.json:
        with args.json.open("w") as f:
            f.writelines(json.dumps({"tree": str(t), **r}) + "\n" for t in trees for r in rows[t])
    for tree in trees:
        for stream in args.streams.split(","):
            mine = [r for r in rows[tree] if r["stream"] == stream]
            print(f"{tree} {stream}, whole run: {ratios(mine, steady=False)}")
            print(f"{tree} {stream}, after the training: {ratios(mine, steady=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
