"""The ``dedup`` command on the inputs a new user brings, and on Ctrl-C.

Unreadable input and input with no readable line fail with what to do; gzip and a byte
order mark are read as they are; repeats say so; an interrupt is one line and exit 130.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dedup import dedup, offline
from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import DocumentFormat
from stream_dedup.dedup import COMPILING_NOTICE, BatchResult, Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from tests.cli.test_cli import RECORDS, Capsys, article, jsonl, read_verdicts, run, write

CONFIG = DedupConfig()


def verdicts_of(path: Path) -> list[tuple[str, str, str | None]]:
    return [(v["id"], v["verdict"], v["duplicate_of"]) for v in read_verdicts(path)]


def test_no_readable_line_fails_with_what_to_check(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "out"), "--id-field", "key")
    assert code == 1
    err = capsys.readouterr().err
    assert "error: no document could be read" in err
    assert "all 6 non-blank line(s) were malformed (missing_id 6)" in err
    assert "--id-field (key)" in err
    assert "--content-fields (title,text)" in err
    assert "JSON Lines" in err
    assert (tmp_path / "out").read_text() == ""


def test_input_that_is_not_json_lines_fails_even_when_quiet(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.csv", "id,text\n1,hello\n2,world\n")
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "out"), "-q")
    assert code == 1
    err = capsys.readouterr().err
    assert "all 3 non-blank line(s) were malformed (invalid_json 3)" in err


def test_some_bad_lines_skipped_exit_0_with_their_count(tmp_path: Path, capsys: Capsys) -> None:
    lines = [json.dumps(RECORDS[0]), "{", json.dumps({"text": "no id"}), json.dumps(RECORDS[1])]
    src = write(tmp_path / "in.jsonl", "\n".join(lines) + "\n")
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "out"), "-q")
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: 2 malformed line(s) skipped (invalid_json 1, missing_id 1;" in err
    assert [v["id"] for v in read_verdicts(tmp_path / "out")] == ["a", "b"]


def test_an_empty_input_is_not_a_failure(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", "\n\n")
    assert run("dedup", str(src), "-o", str(tmp_path / "out"))[0] == 0
    assert "documents   0" in capsys.readouterr().err


def test_gzip_input_file_gives_the_verdicts_of_the_plain_one(tmp_path: Path) -> None:
    plain = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    assert run("dedup", str(plain), "-o", str(tmp_path / "plain.out"), "-q")[0] == 0
    expected = verdicts_of(tmp_path / "plain.out")
    assert len(expected) == 6
    for name in ("in.jsonl.gz", "compressed-without-suffix"):
        packed = tmp_path / name
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        assert run("dedup", str(packed), "-o", str(tmp_path / "gz.out"), "-q")[0] == 0
        assert verdicts_of(tmp_path / "gz.out") == expected


def test_gzip_on_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    data = gzip.compress(jsonl(RECORDS[:3]).encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out = run("dedup", "-", "-o", "-")
    assert code == 0
    assert [json.loads(line)["verdict"] for line in out.splitlines()] == [
        "unique",
        "unique",
        "duplicate",
    ]
    assert "malformed   0" in capsys.readouterr().err


def test_a_byte_order_mark_does_not_spoil_line_1(tmp_path: Path, capsys: Capsys) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes("\ufeff".encode() + jsonl(RECORDS).encode())
    assert run("dedup", str(src), "-o", str(tmp_path / "out"))[0] == 0
    assert [v["id"] for v in read_verdicts(tmp_path / "out")] == [r["id"] for r in RECORDS]
    err = capsys.readouterr().err
    assert "malformed   0" in err
    assert "documents   6" in err


def test_a_corrupt_gzip_input_exits_2_naming_it(tmp_path: Path, capsys: Capsys) -> None:
    packed = gzip.compress(jsonl(RECORDS * 50).encode())
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(packed[: len(packed) // 2])
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "out"))
    assert code == 2
    err = capsys.readouterr().err
    assert f"error: cannot read {src}" in err
    assert "gzip -t" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("mode", ["decide", "replay"])
def test_replayed_ids_are_marked_and_other_texts_revised(
    tmp_path: Path, capsys: Capsys, mode: str
) -> None:
    records = [
        *RECORDS,
        {"id": "a", "title": "Budget approved", "text": RECORDS[0]["text"]},  # same text
        {"id": "b", "text": "something else entirely"},  # other text
        {"id": "z", "text": "something else entirely"},  # a copy of b's new text
    ]
    src = write(tmp_path / "in.jsonl", jsonl(records))
    flags = [] if mode == "decide" else ["--revisions", "replay"]
    assert run("dedup", str(src), "-o", str(tmp_path / "out"), *flags)[0] == 0
    lines = read_verdicts(tmp_path / "out")
    assert lines[6] == {**lines[0], "replayed": True}
    err = capsys.readouterr().err
    if mode == "replay":  # the old behaviour: b's first verdict, its new text never indexed
        assert lines[7] == {**lines[1], "replayed": True}
        assert (lines[8]["verdict"], "revision" in lines[7]) == ("unique", False)
        assert "replayed    2" in err and "mismatched  1" in err and "revisions   0" in err
        return
    assert (lines[7]["revision"], lines[7]["verdict"], "replayed" in lines[7]) == (
        2,
        "unique",
        False,
    )
    assert (lines[8]["verdict"], lines[8]["duplicate_of"], lines[8]["similarity"]) == (
        "duplicate",
        "b",
        1.0,
    )
    assert "replayed    1" in err and "revisions   1" in err and "mismatched  0" in err


# -- Ctrl-C ----------------------------------------------------------------------------


def _raise_from_a_kernel(*args: object, **kwargs: object) -> None:
    """What Ctrl-C inside a compiled kernel looks like to the caller."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        raise SystemError("<numba kernel> returned a result with an exception set") from exc


def _raise_interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("raiser", [_raise_from_a_kernel, _raise_interrupt])
def test_interrupt_is_one_line_and_exit_130(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, raiser: object
) -> None:
    monkeypatch.setattr(offline, "run_offline", raiser)
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    index = tmp_path / "index"
    assert run("dedup", str(src), "-o", str(tmp_path / "out"), "--index", str(index))[0] == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("interrupted; every batch committed before the interrupt is in ")
    assert str(index) in err
    assert "rerun the same command to continue" in err
    # The index was closed on the way out: the next run opens it.
    monkeypatch.undo()
    assert run("dedup", str(src), "-o", str(tmp_path / "out"), "--index", str(index))[0] == 0


def test_interrupt_without_an_index_says_nothing_was_kept(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offline, "run_offline", _raise_from_a_kernel)
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    assert run("dedup", str(src), "-o", str(tmp_path / "out"))[0] == 130
    assert "nothing was kept" in capsys.readouterr().err


def test_a_system_error_of_another_cause_is_not_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise SystemError("a real bug")

    monkeypatch.setattr(offline, "run_offline", broken)
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    with pytest.raises(SystemError, match="a real bug"):
        run("dedup", str(src), "-o", str(tmp_path / "out"))


BATCH = 500


def _story(i: int) -> bytes:
    return json.dumps({"id": f"s{i}", "text": article(i, words=40)}).encode() + b"\n"


def _lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_during_a_long_run_exits_130_and_keeps_whole_batches(
    tmp_path: Path, sigint: str
) -> None:
    """SIGINT to a real run, at a known point: after three whole batches, while it waits
    for more input. The run is started with SIGINT at its default and, as a background job
    of a shell script starts, ignored: both stop."""
    index, out = tmp_path / "index", tmp_path / "verdicts.jsonl"
    disposition = signal.SIG_DFL if sigint == "default" else signal.SIG_IGN
    command = ["dedup", "-", "-o", str(out), "--index", str(index), "--batch-size", str(BATCH)]
    dedup_run = subprocess.Popen(
        [sys.executable, "-m", "stream_dedup.cli", *command],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )
    assert dedup_run.stdin is not None
    try:
        dedup_run.stdin.write(b"".join(_story(i) for i in range(3 * BATCH)))
        dedup_run.stdin.flush()  # the pipe stays open: the run waits for a fourth batch
        deadline = time.monotonic() + 120
        while _lines_in(out) < 3 * BATCH and dedup_run.poll() is None:
            assert time.monotonic() < deadline, "three batches not decided in two minutes"
            time.sleep(0.02)
        assert dedup_run.poll() is None
        dedup_run.send_signal(signal.SIGINT)
        # Closing its input now would end a run that lost the signal with exit code 0.
        err = dedup_run.communicate(timeout=60)[1].decode()
    finally:
        if dedup_run.poll() is None:
            dedup_run.kill()
            dedup_run.communicate()
    assert dedup_run.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted; every batch committed")
    code, stats = run("stats", "--index", str(index))
    assert code == 0
    documents = int(
        next(line for line in stats.splitlines() if line.startswith("documents")).split()[1]
    )
    assert documents == 3 * BATCH
    assert [v["id"] for v in read_verdicts(out)] == [f"s{i}" for i in range(3 * BATCH)]


class _SignalInBatch:
    """A deduplicator whose second batch receives SIGINT while it is decided, as a signal
    lands in a compiled kernel or a call into RocksDB; ``swallow`` drops the exception
    raised there, as such code can."""

    def __init__(self, real: Deduplicator, swallow: bool) -> None:
        self.real, self.swallow, self.batches = real, swallow, 0

    def process(self, docs: list[Document]) -> BatchResult:
        self.batches += 1
        if self.batches == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler runs in here
            except KeyboardInterrupt:
                if not self.swallow:
                    raise
        return self.real.process(docs)


@pytest.mark.parametrize("swallow", [False, True])
def test_ctrl_c_inside_a_batch_stops_after_that_batch(swallow: bool) -> None:
    src = [_story(i) for i in range(10)]
    target = io.StringIO()
    dedup_ = _SignalInBatch(Deduplicator(open_index(None, IndexParams.of(CONFIG)), CONFIG), swallow)
    fmt = DocumentFormat("id", ("text",))
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        offline.run_offline(dedup_, src, target, fmt=fmt, batch_size=4)  # type: ignore[arg-type]
    assert dedup_.batches == 2
    assert [json.loads(line)["id"] for line in target.getvalue().splitlines()] == [
        f"s{i}" for i in range(8)
    ]
    assert signal.getsignal(signal.SIGINT) is handler  # put back


def test_ctrl_c_while_waiting_for_input_stops_at_once() -> None:
    def lines() -> Iterator[bytes]:
        yield _story(0)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # a read that blocks: the interrupt ends it
        yield _story(1)

    target = io.StringIO()
    dedup_ = Deduplicator(open_index(None, IndexParams.of(CONFIG)), CONFIG)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        offline.run_offline(dedup_, lines(), target, fmt=DocumentFormat("id", ("text",)))
    assert time.monotonic() - started < 4
    assert target.getvalue() == ""


@pytest.mark.parametrize("before", [signal.SIG_DFL, signal.SIG_IGN])
def test_the_sigint_handler_found_is_put_back(before: signal.Handlers, tmp_path: Path) -> None:
    saved = signal.signal(signal.SIGINT, before)
    try:
        with offline.InterruptBetweenBatches():
            assert signal.getsignal(signal.SIGINT) is not before
        assert signal.getsignal(signal.SIGINT) is before
        assert run("generate", "-n", "2", "-o", str(tmp_path / "g.jsonl"))[0] == 0
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, saved)


# -- the first run's compilation --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True])
def test_the_first_compilation_is_announced(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    monkeypatch.setattr(dedup.kernels, "kernels_cached", lambda containment=False: cached)
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS * 3))
    with jit.forced(True):  # as a batch of more than jit.SMALL_BATCH documents would
        assert run("dedup", str(src), "-o", str(tmp_path / "out"), "--batch-size", "2")[0] == 0
        err = capsys.readouterr().err
        assert err.startswith(COMPILING_NOTICE + "\n") is not cached
        assert err.count(COMPILING_NOTICE) == (0 if cached else 1)  # before the first batch
        assert run("dedup", str(src), "-o", str(tmp_path / "out"), "-q")[0] == 0
        assert capsys.readouterr().err == ""


def test_a_run_on_the_python_kernels_compiles_nothing_and_says_nothing(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dedup.kernels, "kernels_cached", lambda containment=False: False)
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    with jit.forced(False):  # as a batch of at most jit.SMALL_BATCH documents would
        assert run("dedup", str(src), "-o", str(tmp_path / "out"))[0] == 0
    assert COMPILING_NOTICE not in capsys.readouterr().err
