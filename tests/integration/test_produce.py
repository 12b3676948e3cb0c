"""``produce`` with lines the producer or the broker refuses: none of them costs the others.

A refused line is reported with its line number and reason, the other lines are delivered
(``--on-error skip``) or sending stops at it (``--on-error fail``), the summary counts both,
and the exit code is 1. A topic name the broker refuses is one clear error, exit code 2.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from stream_dedup.tools.produce import REFUSED_SHOWN, send_lines

from .support import Topics, kijiji_documents, read_topic

#: The producer's message.max.bytes in these tests (the documents are all smaller).
LIMIT = 10_000
BIG = "x" * 3 * LIMIT

pytestmark = pytest.mark.broker


def produce_cli(
    tmp_path: Path, lines: list[str], topic: str, bootstrap: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    """``stream-dedup produce FILE --topic T --bootstrap-servers B`` with a small
    ``message.max.bytes``, as a subprocess."""
    source = tmp_path / "lines.jsonl"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    command = ["produce", str(source), "--topic", topic, "--bootstrap-servers", bootstrap]
    return subprocess.run(
        [sys.executable, "-m", "stream_dedup.cli", *command, *flags],
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines_with_big_ones(count: int, big_at: set[int]) -> list[str]:
    """``count`` documents as lines, a blank line third, those at ``big_at`` (1-based line
    numbers, blank line counted) too large for :data:`LIMIT`."""
    docs = kijiji_documents(count)
    lines = [json.dumps(d) for d in docs]
    lines.insert(2, "")
    for n in big_at:
        doc = json.loads(lines[n - 1])
        lines[n - 1] = json.dumps({**doc, "title": BIG})
    return lines


def keys(bootstrap: str, topic: str, expected: int) -> list[str]:
    return sorted((m.key() or b"").decode() for m in read_topic(bootstrap, topic, expected))


def test_a_too_large_line_is_reported_and_the_others_are_delivered(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    lines = lines_with_big_ones(30, {17})
    done = produce_cli(
        tmp_path, lines, topics.input, bootstrap, "--set", f"kafka.message.max.bytes={LIMIT}"
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        f"line 17: refused by the producer, not sent: too large ({len(lines[16]):,} bytes; "
        f"message.max.bytes is {LIMIT}): shorten the line, or raise the limit with "
        "--set kafka.message.max.bytes=N" in done.stderr
    )
    assert f"29 lines delivered to {topics.input}, 1 refused" in done.stderr
    assert "error: 1 line(s) refused" in done.stderr and "send those lines again" in done.stderr
    refused_id = json.loads(lines[16])["id"]
    expected = sorted(json.loads(ln)["id"] for ln in lines if ln and ln != lines[16])
    assert keys(bootstrap, topics.input, 29) == expected
    assert refused_id not in expected


def test_on_error_fail_stops_at_the_first_refused_line(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    lines = lines_with_big_ones(30, {17, 25})
    done = produce_cli(
        tmp_path,
        lines,
        topics.input,
        bootstrap,
        "--set",
        f"kafka.message.max.bytes={LIMIT}",
        "--on-error",
        "fail",
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "line 25" not in done.stderr
    assert f"15 lines delivered to {topics.input}, 1 refused" in done.stderr
    assert "error: line 17: refused by the producer, not sent: too large" in done.stderr
    assert done.stderr.count("line 17:") == 1  # said once, in the error
    assert "Sending stopped there" in done.stderr and "--on-error skip" in done.stderr
    expected = sorted(json.loads(ln)["id"] for ln in lines[:16] if ln)
    assert keys(bootstrap, topics.input, 15) == expected


def test_refusals_beyond_the_first_ten_are_counted(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    big = set(range(4, 4 + REFUSED_SHOWN + 3))
    lines = lines_with_big_ones(20, big)
    done = produce_cli(
        tmp_path, lines, topics.input, bootstrap, "--set", f"kafka.message.max.bytes={LIMIT}"
    )
    assert done.returncode == 1, done.stderr
    shown = [ln for ln in done.stderr.splitlines() if ": refused by the producer" in ln]
    assert [ln.split(":")[0] for ln in shown] == [f"line {n}" for n in sorted(big)[:10]]
    assert f"more refused lines: counted, not shown (the first {REFUSED_SHOWN} are)" in (
        done.stderr
    )
    assert f"{20 - len(big)} lines delivered to {topics.input}, {len(big)} refused" in (done.stderr)
    assert len(keys(bootstrap, topics.input, 20 - len(big))) == 20 - len(big)


def test_a_topic_name_the_broker_refuses_is_one_clear_error(bootstrap: str, tmp_path: Path) -> None:
    lines = [json.dumps(d) for d in kijiji_documents(3)]
    done = produce_cli(tmp_path, lines, "bad name!", bootstrap)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1, done.stderr
    assert err[0].startswith(f"error: the broker at {bootstrap} refuses 'bad name!' as a topic")
    assert "nothing was sent" in err[0] and "--topic" in err[0]


def test_lines_the_broker_refuses_are_counted_with_their_line_numbers(bootstrap: str) -> None:
    """The broker's refusal arrives in the delivery report, after ``produce()`` took the
    line: each is reported as the broker's, with the line it came from."""
    producer = Producer({"bootstrap.servers": bootstrap})
    report = io.StringIO()
    lines = [b'{"id": "a"}\n', b"\n", b'{"id": "b"}\n', b"not json\n"]
    summary = send_lines(
        producer, lines, "bad name!", bootstrap=bootstrap, timeout_s=20.0, report=report
    )
    assert (summary.delivered, summary.refused, summary.refused_by_broker) == (0, 3, 3)
    assert [r.line_no for r in sorted(summary.refusals, key=lambda r: r.line_no)] == [1, 3, 4]
    for n in (1, 3, 4):
        assert f"line {n}: refused by the broker: " in report.getvalue()
    assert "(TOPIC_EXCEPTION)" in report.getvalue()
