"""The offline path's input and output: gzip and byte order marks, read errors, verdict lines."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.lookup_keys import content_digest, exact_key
from stream_dedup.core.normalize import normalize
from stream_dedup.decode import DocumentFormat
from stream_dedup.dedup import COMPILING_NOTICE, Deduplicator, kernels_cached
from stream_dedup.errors import DecodeError, InputError, StreamDedupError
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.records import text_of
from stream_dedup.models import Verdict, VerdictKind
from stream_dedup.offline import (
    MALFORMED_SHOWN,
    MalformedLineError,
    RunSummary,
    open_input,
    read_documents,
    run_offline,
    verdict_line,
)

FMT = DocumentFormat("id", ("title", "text"))
BOM = "\ufeff".encode()

#: Enough lines that the gzip stream is several of the reader's blocks long.
LINES = [json.dumps({"id": f"d{i}", "text": f"story {i} " * (i % 50 + 1)}) for i in range(3000)]
PLAIN = ("\n".join(LINES) + "\n").encode()


def read_all(path: str) -> bytes:
    with ExitStack() as stack:
        return open_input(path, stack).read()


def ids(path: str) -> list[str]:
    with ExitStack() as stack:
        source = open_input(path, stack)
        docs = read_documents(source, FMT, RunSummary(), "fail", io.StringIO())
        return [d.id for d in docs]


@pytest.mark.parametrize("name", ["in.jsonl.gz", "in.jsonl", "in"])
def test_gzip_files_are_read_by_their_magic_bytes(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(PLAIN))
    assert read_all(str(path)) == PLAIN
    assert ids(str(path)) == [f"d{i}" for i in range(3000)]


def test_gzip_of_several_members_is_read_whole(tmp_path: Path) -> None:
    half = len(PLAIN) // 2
    path = tmp_path / "in.gz"
    path.write_bytes(gzip.compress(PLAIN[:half]) + gzip.compress(PLAIN[half:]))
    assert read_all(str(path)) == PLAIN


def test_plain_files_are_read_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    for data in (PLAIN, b"", b"{", b"\x1f", b"\xef\xbb"):
        path.write_bytes(data)
        assert read_all(str(path)) == data


@pytest.mark.parametrize("compress", [False, True])
def test_gzip_and_plain_on_standard_input(monkeypatch: pytest.MonkeyPatch, compress: bool) -> None:
    data = gzip.compress(BOM + PLAIN) if compress else BOM + PLAIN
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert read_all("-") == PLAIN


@pytest.mark.parametrize("compress", [False, True])
def test_a_leading_byte_order_mark_is_dropped(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / "in.jsonl"
    data = BOM + PLAIN
    path.write_bytes(gzip.compress(data) if compress else data)
    assert read_all(str(path)) == PLAIN
    assert ids(str(path))[0] == "d0"  # line 1 parses


def test_only_a_leading_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(BOM + b'{"id": "a", "text": "x"}\n' + BOM + b'{"id": "b", "text": "y"}\n')
    summary = RunSummary()
    with ExitStack() as stack:
        docs = read_documents(open_input(str(path), stack), FMT, summary, "skip", io.StringIO())
        assert [d.id for d in docs] == ["a"]
    assert summary.malformed_lines == [2]


def test_a_missing_input_is_an_input_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(InputError, match=r"nope\.jsonl does not exist.*pass - to read"):
        read_all(str(missing))


def test_a_directory_as_input_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"cannot open input {re.escape(str(tmp_path))}"):
        read_all(str(tmp_path))


def test_a_corrupt_gzip_stream_is_an_input_error(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(PLAIN))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(InputError, match=r"bad\.jsonl\.gz.*corrupt or cut short.*gzip -t"):
        ids(str(path))


def test_a_truncated_gzip_stream_is_an_input_error(tmp_path: Path) -> None:
    packed = gzip.compress(PLAIN)
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) - 100])
    with pytest.raises(InputError, match=r"cut\.gz.*cut short"):
        ids(str(path))


def test_a_bad_gzip_header_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "header.gz"
    path.write_bytes(b"\x1f\x8b\x07" + bytes(20))  # gzip magic, unknown method
    with pytest.raises(InputError, match=r"header\.gz"):
        read_all(str(path))


def test_errors_of_the_offline_path_are_in_the_tree() -> None:
    err = MalformedLineError(3, DecodeError("invalid_json", "x"))
    assert isinstance(err, StreamDedupError)
    assert isinstance(err, InputError)
    assert issubclass(InputError, StreamDedupError)


def test_verdict_lines_mark_replays_and_empty_content() -> None:
    fresh = Verdict("a", VerdictKind.UNIQUE, None, None, "a")
    replay = Verdict("a", VerdictKind.UNIQUE, None, None, "a", replayed=True)
    empty = Verdict("e", VerdictKind.UNIQUE, None, None, "e", empty=True, replayed=True)
    assert "replayed" not in json.loads(verdict_line(fresh))
    assert json.loads(verdict_line(replay)) == {**json.loads(verdict_line(fresh)), "replayed": True}
    assert json.loads(verdict_line(empty))["empty"] is True
    assert json.loads(verdict_line(empty))["replayed"] is True


def test_the_summary_shows_revisions_and_mismatched_repeats() -> None:
    summary = RunSummary(documents=5, replayed=3, mismatched_repeats=2, revisions=4)
    text = summary.render()
    assert "replayed    3" in text
    assert "revisions   4" in text
    assert "mismatched  2" in text
    assert not summary.nothing_read
    assert RunSummary(malformed=4).nothing_read
    assert not RunSummary().nothing_read  # an empty input is not a failure


def test_kernels_cached_is_true_once_the_kernels_have_run() -> None:
    config = DedupConfig()
    index = open_index(None, IndexParams.of(config))
    try:
        cached_before = kernels_cached()
        notices: list[str] = []
        Deduplicator(index, config).warm_up(notices.append)
    finally:
        index.close()
    assert kernels_cached()
    assert notices == ([] if cached_before else [COMPILING_NOTICE])


@pytest.mark.slow
def test_containment_adds_its_kernel_to_the_cache_check(tmp_path: Path) -> None:
    """In a fresh cache, a warm-up without containment leaves the intersections kernel
    uncompiled: the check with containment still says False; a warm-up with it fills it."""
    probe = textwrap.dedent(
        """
        from stream_dedup.core.config import DedupConfig
        from stream_dedup.dedup import Deduplicator, kernels_cached
        from stream_dedup.index import open_index
        from stream_dedup.index.params import IndexParams

        for c in (0.0, 0.8):
            config = DedupConfig(containment=c)
            Deduplicator(open_index(None, IndexParams.of(config)), config).warm_up(print)
            print(kernels_cached(), kernels_cached(containment=True))
        """
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [
        COMPILING_NOTICE,
        "True False",
        COMPILING_NOTICE,
        "True True",
    ]


@pytest.mark.slow
def test_a_cold_cache_is_announced_and_filled_by_the_warm_up(tmp_path: Path) -> None:
    """In a fresh numba cache directory nothing is cached: the warm-up says so, compiles
    (several seconds), and leaves the kernels cached."""
    probe = textwrap.dedent(
        """
        from stream_dedup.core.config import DedupConfig
        from stream_dedup.dedup import Deduplicator, kernels_cached
        from stream_dedup.index import open_index
        from stream_dedup.index.params import IndexParams

        config = DedupConfig()
        print(kernels_cached())
        Deduplicator(open_index(None, IndexParams.of(config)), config).warm_up(print)
        print(kernels_cached())
        """
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == ["False", COMPILING_NOTICE, "True"]
    assert any((tmp_path / "numba-cache").rglob("*.nbi"))


RECORDS_WITH_REPEATS = [
    {"id": "a", "text": "the first text of a"},
    {"id": "b", "text": "b"},
    {"id": "a", "text": "THE  first text of a"},  # same normalised text
    {"id": "a", "text": "a second text of a"},  # other text
    {"id": "b", "text": ""},  # b emptied
    {"id": "c", "text": "c"},
]


def _run_repeats(**overrides: object) -> tuple[RunSummary, list[dict[str, object]]]:
    lines = [json.dumps(r).encode() + b"\n" for r in RECORDS_WITH_REPEATS]
    config = DedupConfig(**overrides)  # type: ignore[arg-type]
    index = open_index(None, IndexParams.of(config))
    out = io.StringIO()
    try:
        summary = run_offline(Deduplicator(index, config), lines, out, fmt=FMT, batch_size=2)
    finally:
        index.close()
    return summary, [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_run_summary_counts_replays_and_revisions() -> None:
    summary, written = _run_repeats()
    assert (summary.documents, summary.replayed, summary.revisions) == (6, 1, 2)
    assert summary.mismatched_repeats == 0
    assert [v.get("replayed", False) for v in written] == [False, False, True, False, False, False]
    assert [v.get("revision", 1) for v in written] == [1, 1, 1, 2, 2, 1]
    assert written[3]["previous"] == _tag("the first text of a")
    assert (written[4]["empty"], written[4]["previous"]) == (True, _tag("b"))


def _tag(text: str) -> str:
    return text_of(exact_key(content_digest(normalize(text).encode())))


def test_the_run_summary_counts_mismatched_repeats_under_replay() -> None:
    summary, written = _run_repeats(revisions="replay")
    assert (summary.documents, summary.replayed, summary.mismatched_repeats) == (6, 3, 2)
    assert summary.revisions == 0
    assert [v.get("replayed", False) for v in written] == [False, False, True, True, True, False]
    assert all("revision" not in v for v in written)


def test_a_flood_of_malformed_lines_is_reported_up_to_a_bound(tmp_path: Path) -> None:
    """A wrong field name on a large file prints a bounded report, then the summary."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"key": str(i), "text": "x"}) + "\n" for i in range(500)))
    report = io.StringIO()
    with src.open("rb") as lines:
        docs = list(read_documents(lines, DocumentFormat(), RunSummary(), "skip", report))
    assert docs == []
    shown = report.getvalue().splitlines()
    assert len(shown) == MALFORMED_SHOWN + 1
    assert shown[-1].startswith("more malformed lines")
