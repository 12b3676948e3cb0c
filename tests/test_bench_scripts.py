"""The benchmark scripts run as their docs say (``python bench/<script>.py``), from a
checkout with the package installed and nothing on ``PYTHONPATH``: a script that cannot
import what it measures, or no longer finds the call it times, fails here and not on the
day someone needs its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The scripts; the other modules of ``bench/`` are helpers they import (no ``__main__``).
SCRIPTS = sorted(
    p.name for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text()
)


def run_script(name: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, f"bench/{name}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) > 20 and "bench_match.py" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_answers_help(name: str) -> None:
    done = run_script(name, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")


def test_the_matching_benchmark_records_and_replays_the_passes_of_a_run() -> None:
    """It times ``match_batch`` by recording the deduplicator's calls: where the
    deduplicator no longer made the call it patches, it would record none."""
    done = run_script("bench_match.py", "--workload", "kijiji", "--repeats", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"kijiji \((\d+) docs, (\d+) live, (\d+) calls", done.stdout)
    assert found is not None, done.stdout
    docs, live, calls = (int(g) for g in found.groups())
    assert docs == live == 2627  # the bundled ads, each decided once
    assert calls == 3  # batches of 1,000
    assert re.search(r"median [0-9.]+ ms, [0-9.]+ us/doc", done.stdout)
