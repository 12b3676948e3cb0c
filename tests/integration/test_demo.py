"""`stream-dedup demo` runs the whole service end to end and reports what it did."""

from __future__ import annotations

import re
from io import StringIO

import pytest

from stream_dedup.cli.app import main

pytestmark = pytest.mark.broker


def test_demo_streams_the_sample_through_the_service_and_summarises() -> None:
    out = StringIO()
    assert main(["demo", "-n", "400", "--http-port", "0"], out=out) == 0
    text = out.getvalue()
    docs = int(re.search(r"documents\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    unique = int(re.search(r"unique\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    dup = int(re.search(r"duplicate\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    dead = int(re.search(r"dead-lettered\s+([\d,]+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert docs == 400 and unique + dup == 400
    assert dup > 50, "the sample is built with many re-runs"
    assert dead == 4, "each deliberately malformed message is dead-lettered"
    clusters = re.findall(r"^\s+(\d+) re-runs of (doc-\d+)", text, re.M)
    assert 1 <= len(clusters) <= 5
    counts = [int(c) for c, _ in clusters]
    assert counts == sorted(counts, reverse=True) and counts[0] >= 2
    assert re.search(r"metrics: http://127\.0\.0\.1:\d+/metrics", text)
    assert "service stopped cleanly" in text
