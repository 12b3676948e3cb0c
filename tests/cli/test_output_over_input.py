"""``dedup -o`` refuses an output that is the input itself, whatever name it goes by.

Opening the output empties it, so an output that is the input would lose the input before
it is read. Each refusal exits 2 with what to do, before anything is opened for writing
(no index is created either), and leaves the input's bytes as they were.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import RECORDS, Capsys, jsonl, read_verdicts, run, write

WHAT_TO_DO = "Name another file with -o, or -o - to write to standard output"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return write(tmp_path / "in.jsonl", jsonl(RECORDS))


def refused(capsys: Capsys, source: Path, before: bytes, *argv: str) -> str:
    """Run ``dedup`` with ``argv``; assert it was refused and the input is whole."""
    code, out = run("dedup", *argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert out == ""
    assert source.read_bytes() == before
    assert err.count("\n") == 1 and err.startswith("error: the output "), err
    assert WHAT_TO_DO in err
    return err


def test_the_same_path_is_refused(tmp_path: Path, source: Path, capsys: Capsys) -> None:
    before = source.read_bytes()
    index = tmp_path / "index"
    err = refused(capsys, source, before, str(source), "-o", str(source), "--index", str(index))
    assert f"is the input {source} (the same file)" in err
    assert not index.exists()  # refused before the index was opened, too


def test_a_relative_path_to_the_input_is_refused(
    tmp_path: Path, source: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    before = source.read_bytes()
    refused(capsys, source, before, str(source), "-o", "../in.jsonl")
    refused(capsys, source, before, "../sub/../in.jsonl", "-o", str(source))


def test_a_symbolic_link_to_the_input_is_refused(
    tmp_path: Path, source: Path, capsys: Capsys
) -> None:
    link = tmp_path / "link.jsonl"
    link.symlink_to(source)
    before = source.read_bytes()
    refused(capsys, source, before, str(source), "-o", str(link))
    refused(capsys, source, before, str(link), "-o", str(source))


def test_a_hard_link_to_the_input_is_refused(tmp_path: Path, source: Path, capsys: Capsys) -> None:
    other = tmp_path / "other-name.jsonl"
    os.link(source, other)
    before = source.read_bytes()
    refused(capsys, source, before, str(source), "-o", str(other))


def test_standard_input_redirected_from_the_output_is_refused(source: Path) -> None:
    """``stream-dedup dedup - -o in.jsonl < in.jsonl``: the same loss through a shell."""
    before = source.read_bytes()
    with source.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "stream_dedup.cli", "dedup", "-", "-o", str(source), "-q"],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert "is the standard input's file (the same file)" in done.stderr
    assert WHAT_TO_DO in done.stderr and "Traceback" not in done.stderr
    assert source.read_bytes() == before


def test_a_new_output_and_standard_input_are_fine(
    tmp_path: Path, source: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = source.read_bytes()
    fresh = tmp_path / "verdicts.jsonl"
    assert run("dedup", str(source), "-o", str(fresh), "-q")[0] == 0
    assert len(read_verdicts(fresh)) == len(RECORDS)

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(before)))
    piped = tmp_path / "piped.jsonl"
    assert run("dedup", "-", "-o", str(piped), "-q")[0] == 0
    assert read_verdicts(piped) == read_verdicts(fresh)

    # an existing output that is another file is overwritten, as before
    assert run("dedup", str(source), "-o", str(piped), "-q")[0] == 0
    assert read_verdicts(piped) == read_verdicts(fresh)
    assert source.read_bytes() == before
    assert capsys.readouterr().err == ""
