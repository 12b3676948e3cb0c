"""Retention options that cannot do what they say fail or warn, never pass in silence.

A zero window is an error naming the option; a window in force over documents without a
time warns once per run on stderr (how many had none, and ``--time-field``); ``stats``
says when the window's clock was never set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli import Capsys, article, jsonl, run, write

HOUR_MS = 3_600_000


def records(n: int, time_field: str | None = "ts", missing: set[int] | None = None) -> str:
    """``n`` distinct documents an hour apart; ``time_field`` None or ``missing``: no time."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        rec: dict[str, Any] = {"id": f"d{i}", "text": article(100 + i, 40)}
        if time_field is not None and i not in (missing or set()):
            rec[time_field] = 1_790_000_000_000 + i * HOUR_MS
        out.append(rec)
    return jsonl(out)


def clock_line(index: Path) -> str:
    code, out = run("stats", "--index", str(index))
    assert code == 0
    return next(line for line in out.splitlines() if line.startswith("stream clock"))


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("zero", ["0", "0d", "0h", "0s"])
def test_a_zero_retention_is_an_error_naming_the_option(
    tmp_path: Path, capsys: Capsys, zero: str
) -> None:
    src = write(tmp_path / "in.jsonl", records(3))
    for extra in ([], ["--time-field", "ts"]):
        index = tmp_path / f"index{len(extra)}"
        argv = ["dedup", str(src), "-o", str(tmp_path / "out"), "--index", str(index)]
        assert run(*argv, "--retention", zero, *extra)[0] == 2
        err = capsys.readouterr().err
        assert "'--retention'" in err and "window of zero" in err
        assert "write 'none'" in err and "leave the option out" in err
        assert not index.exists(), "nothing is opened before the options are checked"


def test_retention_none_still_needs_no_time_field(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", records(3, time_field=None))
    assert run("dedup", str(src), "-o", str(tmp_path / "out"), "--retention", "none", "-q")[0] == 0
    assert warnings_in(capsys.readouterr().err) == []


def test_a_time_field_missing_from_every_document_warns_once(
    tmp_path: Path, capsys: Capsys
) -> None:
    src = write(tmp_path / "in.jsonl", records(7))
    index = tmp_path / "index"
    argv = ["dedup", str(src), "-o", str(tmp_path / "out"), "--index", str(index)]
    code, _ = run(*argv, "--retention", "12h", "--time-field", "nosuch", "--batch-size", "2", "-q")
    assert code == 0
    (line,) = warnings_in(capsys.readouterr().err)  # one line for the run, not one per batch
    assert "retention window 12h" in line and "7 of 7 documents had no time" in line
    assert "'nosuch'" in line and "4 batch(es)" in line and "--time-field" in line
    assert "clock was never set" in line
    clock = clock_line(index)
    assert clock.split()[2] == "-" and "never set" in clock and "--time-field" in clock


def test_a_stored_window_without_a_time_field_warns(tmp_path: Path, capsys: Capsys) -> None:
    index = tmp_path / "index"
    timed = write(tmp_path / "timed.jsonl", records(4))
    untimed = write(tmp_path / "untimed.jsonl", records(3, time_field=None))
    out = str(tmp_path / "out")
    first = ["dedup", str(timed), "-o", out, "--index", str(index), "-q"]
    assert run(*first, "--retention", "12h", "--time-field", "ts")[0] == 0
    assert warnings_in(capsys.readouterr().err) == []
    # The window stored in the index stays in force; the rerun names no time.
    assert run("dedup", str(untimed), "-o", out, "--index", str(index), "-q")[0] == 0
    (line,) = warnings_in(capsys.readouterr().err)
    assert "the index's retention window 12h" in line and "no --time-field" in line
    assert "3 of 3 documents had no time" in line and "stream's clock as it stood" in line
    clock = clock_line(index)
    assert "never set" not in clock and clock.split()[2].startswith("2026-")


def test_some_documents_without_a_time_take_the_clock_without_a_warning(
    tmp_path: Path, capsys: Capsys
) -> None:
    src = write(tmp_path / "in.jsonl", records(6, missing={1, 4}))
    argv = ["dedup", str(src), "-o", str(tmp_path / "out"), "--batch-size", "2", "-q"]
    assert run(*argv, "--retention", "12h", "--time-field", "ts")[0] == 0
    assert warnings_in(capsys.readouterr().err) == []


def test_max_documents_alone_needs_no_time(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", records(4, time_field=None))
    index = tmp_path / "index"
    argv = ["dedup", str(src), "-o", str(tmp_path / "out"), "--index", str(index), "-q"]
    assert run(*argv, "--max-documents", "2")[0] == 0
    assert warnings_in(capsys.readouterr().err) == []
    clock = clock_line(index)
    assert clock.split()[2:] == ["-"]
