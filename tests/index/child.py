"""Run Python code in a child process: for what only a separate process shows (a held
lock, a process killed with ``kill -9`` before it closed the index)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_child(code: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) with this interpreter; its output is captured as text."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
