"""The Python API (:class:`stream_dedup.Detector`) over RocksDB on disk and in memory.

Its verdicts must be the offline command's for the same stream, a query must leave the
index exactly as it was, and a reopened directory must carry on with its own parameters.
"""

from __future__ import annotations

import doctest
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stream_dedup
import stream_dedup.api
import stream_dedup.errors
from stream_dedup import DedupConfig, Detector, DetectorStats, Document, QueryResult, Verdict
from stream_dedup.cli.app import main
from stream_dedup.core.normalize import normalize
from stream_dedup.errors import (
    ConfigError,
    DecodeError,
    IndexLockedError,
    IndexMismatchError,
    IndexStoreError,
    RetentionWarning,
    StreamDedupError,
)
from stream_dedup.index.rocks import RocksBackend
from stream_dedup.offline import verdict_line
from stream_dedup.tools.generate import StreamSpec, generate

ROOT = Path(__file__).resolve().parent.parent
DOCS_PAGE = ROOT / "docs" / "python-api.md"

#: A stream of wire stories and their re-runs: originals, near-duplicates, exact copies.
STORIES: list[tuple[str, str]] = [
    (r["id"], f"{r['title']}\n{r['text']}")
    for r in generate(StreamSpec(documents=400, rerun_rate=0.45, seed=11))
]


@pytest.fixture(params=["memory", "rocks"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """Where a parametrised test keeps its index: ``None`` (memory) or a RocksDB directory."""
    return None if request.param == "memory" else tmp_path / "index"


@pytest.fixture
def detector(where: Path | None) -> Iterator[Detector]:
    with Detector(where) as d:
        yield d


def jaccard(a: str, b: str, k: int = 5) -> float:
    """Exact Jaccard of the texts' character k-gram sets, straight from the definition."""

    def grams(text: str) -> set[str]:
        t = normalize(text)
        return {t[i : i + k] for i in range(len(t) - k + 1)} or {t}

    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


def event(v: Verdict) -> dict[str, Any]:
    """A verdict as the offline command writes it (its own line format)."""
    written: dict[str, Any] = json.loads(verdict_line(v))
    return written


def offline(tmp_path: Path, docs: list[tuple[str, str]], *extra: str) -> list[dict[str, Any]]:
    """The verdict lines of ``stream-dedup dedup`` over ``docs`` as JSON Lines."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs), "utf-8")
    assert main(["dedup", str(src), "-o", str(dst), "-q", *extra], out=io.StringIO()) == 0
    return [json.loads(line) for line in dst.read_text("utf-8").splitlines()]


def everything(index_dir: Path) -> list[tuple[bytes, bytes]]:
    """Every key and value of a RocksDB index, read through a read-only view (no lock)."""
    view = RocksBackend(index_dir, read_only=True)
    try:
        return list(view.scan_prefix(b""))
    finally:
        view.close()


# -- the documentation runs --------------------------------------------------------------


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(stream_dedup.api, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5
    assert result.failed == 0


def test_docs_page_example_runs_as_written(tmp_path: Path) -> None:
    """Every ``python`` block of docs/python-api.md, run in order in a fresh interpreter."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS_PAGE.read_text("utf-8"), flags=re.S)
    assert blocks
    run = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    printed = re.findall(r"```text\n(.*?)```", DOCS_PAGE.read_text("utf-8"), flags=re.S)
    assert run.stdout == "".join(printed)


# -- adding ------------------------------------------------------------------------------


def test_near_duplicates_of_the_ads_are_found_with_their_similarity(
    detector: Detector, kijiji_ads: list[tuple[str, str]]
) -> None:
    verdicts = detector.add_many(kijiji_ads)
    text = dict(kijiji_ads)
    dups = [v for v in verdicts if v.is_duplicate]
    assert len(dups) > 500  # the ads are full of re-posts
    near = [v for v in dups if v.similarity is not None and v.similarity < 1.0]
    assert len(near) > 50  # and not only verbatim ones
    for v in dups:
        assert v.duplicate_of is not None and v.similarity is not None
        assert int(v.duplicate_of) < int(v.id)  # an earlier ad
        assert v.similarity >= 0.8
        assert v.similarity == pytest.approx(jaccard(text[v.id], text[v.duplicate_of]), abs=1e-6)
    assert detector.stats == DetectorStats(
        documents=len(kijiji_ads),
        indexed=len(kijiji_ads),
        duplicates=len(dups),
        empty=sum(v.empty for v in verdicts),
    )
    assert len(detector) == len(kijiji_ads)


@pytest.mark.parametrize("batch_size", [1000, 7])
def test_verdicts_equal_the_offline_commands(
    where: Path | None, tmp_path: Path, batch_size: int
) -> None:
    docs = [
        *STORIES,
        ("blank", "  \n "),
        ("doc-000003", "a revised text"),  # revision 2 of an id
        ("doc-000003", STORIES[3][1]),  # its revision 1 again
    ]
    expected = offline(tmp_path, docs, "--index", str(tmp_path / "cli-index"))
    with Detector(where, batch_size=batch_size) as detector:
        half = len(docs) // 2
        got = [detector.add(*docs[0]), *detector.add_many(docs[1:half])]
        got += detector.add_many(Document(i, t) for i, t in docs[half:])
    assert [event(v) for v in got] == expected
    assert sum(v["verdict"] == "duplicate" for v in expected) > 100
    assert got[-1].replayed and (got[-2].revision, got[-2].replayed) == (2, False)
    assert got[-3].empty and (got[-1].revision, got[-1].previous) == (1, None)


def test_verdicts_equal_the_offline_commands_on_the_ads(
    tmp_path: Path, kijiji_ads: list[tuple[str, str]]
) -> None:
    expected = offline(tmp_path, kijiji_ads, "--threshold", "0.7", "--num-perm", "64")
    with Detector(threshold=0.7, num_perm=64) as detector:
        assert [event(v) for v in detector.add_many(kijiji_ads)] == expected


def test_an_id_added_again_gets_its_stored_verdict(detector: Detector) -> None:
    first = detector.add_many(STORIES[:50])
    stats = detector.stats
    again = detector.add_many(STORIES[:50])
    assert all(v.replayed for v in again)
    assert [v.to_json() for v in again] == [v.to_json() for v in first]
    assert [v.empty for v in again] == [v.empty for v in first]
    assert detector.stats == stats
    # A new text under a decided id is its next revision (revisions="replay": the old
    # verdict, and nothing changes).
    revised = detector.add(STORIES[0][0], "something else entirely")
    assert (revised.replayed, revised.revision) == (False, 2)
    assert len(detector) == stats.documents + 1
    with Detector(revisions="replay") as replaying:
        (old,) = replaying.add_many(STORIES[:1])
        assert replaying.add(STORIES[0][0], "something else entirely") == Verdict(
            old.id, old.verdict, old.duplicate_of, old.similarity, old.cluster_id, replayed=True
        )
        assert len(replaying) == 1


def test_empty_text_is_unique_and_not_indexed(detector: Detector) -> None:
    v = detector.add("blank", " \t\n ")
    assert (v.verdict, v.empty, v.cluster_id) == ("unique", True, "blank")
    assert detector.stats == DetectorStats(documents=1, indexed=0, duplicates=0, empty=1)
    assert detector.query("   ") == QueryResult(False, None, None, None, empty=True)


# -- asking ------------------------------------------------------------------------------


def test_query_answers_what_add_would_without_indexing(where: Path | None) -> None:
    base, asked = STORIES[:300], [t for _, t in STORIES[300:]]
    with Detector(where) as detector:
        detector.add_many(base)
        found = detector.query_many(asked)
        assert found == [detector.query(t) for t in asked]
        assert sum(r.is_duplicate for r in found) > 20
        assert any(not r.is_duplicate for r in found)
    # Each answer is the verdict the text gets when added next, under a new id.
    for text, answer in list(zip(asked, found, strict=True))[:8]:
        with Detector() as fresh:
            fresh.add_many(base)
            v = fresh.add("new", text)
            assert answer.is_duplicate == v.is_duplicate
            assert (answer.duplicate_of, answer.similarity) == (v.duplicate_of, v.similarity)
            assert answer.cluster_id == (v.cluster_id if v.is_duplicate else None)


def test_queries_do_not_see_each_other(detector: Detector) -> None:
    """Near-duplicate queries of one call are each answered against the index alone."""
    story = STORIES[0][1]
    detector.add("other", STORIES[1][1])
    found = detector.query_many([story, story, story.upper(), story + " (updated)"])
    assert not any(r.is_duplicate for r in found)
    detector.add("story", story)
    found = detector.query_many([story, story.upper(), story + " (updated)", ""])
    assert [(r.is_duplicate, r.duplicate_of) for r in found] == [(True, "story")] * 3 + [
        (False, None)
    ]
    assert found[0].similarity == found[1].similarity == 1.0
    assert found[2].similarity == pytest.approx(jaccard(story, story + " (updated)"), abs=1e-6)
    assert found[3].empty


def test_a_query_leaves_the_index_byte_for_byte_unchanged(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    with Detector(index_dir) as detector:
        detector.add_many(STORIES[:250])
    before = everything(index_dir)
    asked = [t for _, t in STORIES[200:]] + ["", STORIES[0][1], "\x00query 0:0"]
    with Detector(index_dir) as detector:
        stats, sequence = detector.stats, detector.index._backend.sequence()
        detector.query_many(asked)
        for text in asked[:20]:
            detector.query(text)
        assert detector.stats == stats
        assert detector.index._backend.sequence() == sequence  # not one write
        assert everything(index_dir) == before  # while open, from a read-only view
    assert everything(index_dir) == before  # and once closed
    # The ids queries are decided under cannot shadow a real document's.
    with Detector(index_dir) as detector:
        detector.add("\x00query 0:0", STORIES[0][1])
        assert detector.query(STORIES[0][1]).duplicate_of == STORIES[0][0]
        assert detector.query("a text nobody wrote before").is_duplicate is False


def test_a_query_leaves_the_memory_index_unchanged() -> None:
    with Detector() as detector:
        detector.add_many(STORIES[:250])
        before, stats = list(detector.index._backend.scan_prefix(b"")), detector.stats
        detector.query_many([t for _, t in STORIES])
        assert list(detector.index._backend.scan_prefix(b"")) == before
        assert detector.stats == stats


# -- reopening ---------------------------------------------------------------------------


def test_reopening_a_directory_continues_from_it(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    with Detector(index_dir, config=DedupConfig(threshold=0.7, num_perm=64)) as detector:
        first = detector.add_many(STORIES[:200])
        params = detector.index.params
    with Detector(index_dir) as detector:  # no parameters: the index's own
        assert detector.index.params == params
        assert (detector.config.threshold, detector.config.num_perm) == (0.7, 64)
        assert len(detector) == 200
        rest = detector.add_many(STORIES[200:])
    with Detector(threshold=0.7, num_perm=64) as whole:
        assert [event(v) for v in first + rest] == [event(v) for v in whole.add_many(STORIES)]
    with Detector(index_dir, threshold=0.7) as detector:  # agreeing with the index: fine
        assert detector.stats.documents == len(STORIES)
        assert detector.query(STORIES[5][1]).is_duplicate


def test_a_conflicting_parameter_raises_the_mismatch_error(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    with Detector(index_dir, threshold=0.7) as detector:
        detector.add_many(STORIES[:20])
    with pytest.raises(IndexMismatchError) as err:
        Detector(index_dir, threshold=0.9)
    assert "threshold: index has 0.7, asked for 0.9" in str(err.value)
    assert "cannot be reused" in str(err.value)
    assert err.value.differences["threshold"] == (0.7, 0.9)
    with pytest.raises(IndexMismatchError, match="num_perm: index has 128, asked for 64"):
        Detector(index_dir, num_perm=64)
    with pytest.raises(IndexMismatchError, match="threshold"):
        Detector(index_dir, config=DedupConfig())
    with pytest.raises(IndexMismatchError) as err:
        Detector(index_dir, shingle_kind="word")  # and its usual size, 3 words
    assert err.value.differences["shingle_kind"] == ("char", "word")
    assert err.value.differences["shingle_k"] == (5, 3)
    # A refused open leaves the directory free and untouched.
    with Detector(index_dir) as detector:
        assert len(detector) == 20


# -- errors and the package --------------------------------------------------------------


def test_bad_parameters_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="'thresold': not a detector parameter"):
        Detector(thresold=0.8)
    with pytest.raises(ConfigError, match="'threshold'"):
        Detector(threshold=1.5)
    with pytest.raises(ConfigError, match="'threshold'"):
        Detector(threshold="high")
    with pytest.raises(ConfigError, match="'shingle_kind'"):
        Detector(shingle_kind="byte")
    with pytest.raises(ConfigError, match="'config'"):
        Detector(config=DedupConfig(), threshold=0.8)
    with pytest.raises(ConfigError, match="'batch_size'"):
        Detector(batch_size=0)
    assert issubclass(ConfigError, StreamDedupError)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"threshold": "0.8"}, "'threshold': expected a number, got '0.8' (str)"),
        ({"num_perm": 12.5}, "'num_perm': expected an integer, got 12.5 (float)"),
        ({"num_perm": True}, "'num_perm': expected an integer, got True (bool)"),
        ({"max_candidates": "10"}, "'max_candidates': expected an integer, got '10' (str)"),
    ],
)
def test_a_parameter_of_the_wrong_type_names_it_and_its_type(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Detector(**params)
    assert message in str(err.value)
    with Detector(threshold=1, num_perm=64) as detector:  # an integer is a number
        assert detector.config.threshold == 1


def test_bad_documents_are_decode_errors(detector: Detector) -> None:
    with pytest.raises(DecodeError, match="must not be empty"):
        detector.add("", "text")
    with pytest.raises(DecodeError, match="must be a str"):
        detector.add(7, "text")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="must be a str"):
        detector.add("id", b"bytes")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="pair"):
        detector.add_many(["just a string"])  # type: ignore[list-item]
    with pytest.raises(DecodeError, match="must be a str"):
        detector.query_many(["fine", None])  # type: ignore[list-item]
    assert len(detector) == 0  # nothing of a refused call was written


@pytest.mark.parametrize("given", ["abc", b"abc"])
def test_a_single_string_is_refused_where_a_list_belongs(detector: Detector, given: Any) -> None:
    with pytest.raises(TypeError, match=r"query_many\(\) takes a list .* pass a list"):
        detector.query_many(given)
    with pytest.raises(TypeError, match=r"add_many\(\) takes a list .* pass a list"):
        detector.add_many(given)
    with pytest.raises(DecodeError, match="pair, got str"):
        detector.add_many(("ab", "cd"))  # two two-letter strings are not two (id, text) pairs
    assert len(detector) == 0


def test_a_closed_detector_refuses_work(where: Path | None) -> None:
    detector = Detector(where)
    detector.close()
    detector.close()  # again: nothing to do
    for call in (
        lambda: detector.add("a", "b"),
        lambda: detector.query("b"),
        lambda: len(detector),
    ):
        with pytest.raises(IndexStoreError, match="closed"):
            call()
    assert "closed" in repr(detector)


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with Detector(tmp_path / "index"), pytest.raises(IndexLockedError):
        Detector(tmp_path / "index")


def test_a_path_that_cannot_hold_an_index_is_an_index_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(IndexStoreError, match="cannot open an index"):
        Detector(tmp_path / "a-file")


def test_the_package_exports_the_api() -> None:
    assert stream_dedup.Detector is Detector
    assert stream_dedup.QueryResult is QueryResult
    for name in stream_dedup.__all__:
        assert getattr(stream_dedup, name) is not None
    run = subprocess.run(
        [sys.executable, "-c", "import stream_dedup; print(stream_dedup.Detector.__module__)"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert run.stdout.strip() == "stream_dedup.api"


def test_the_package_exports_the_error_tree_and_only_public_names() -> None:
    from stream_dedup import IndexLockedError as Locked
    from stream_dedup import StreamDedupError as Root

    assert Root is StreamDedupError
    assert Locked is IndexLockedError
    tree = {
        name
        for name, value in vars(stream_dedup.errors).items()
        if isinstance(value, type) and issubclass(value, StreamDedupError)
    }
    assert tree <= set(stream_dedup.__all__)
    for name in stream_dedup.__all__:
        assert getattr(stream_dedup, name) is not None, name
        exec(f"from stream_dedup import {name}", {})
    # The deduplicator and the index are internals (docs/design.md), not the package's face.
    for internal in ("BatchResult", "Deduplicator", "DedupIndex", "open_index"):
        assert internal not in stream_dedup.__all__
        with pytest.raises(AttributeError):
            getattr(stream_dedup, internal)


def test_retention_bounds_what_a_detector_holds(tmp_path: Path) -> None:
    texts = [" ".join(f"w{i}x{j} story{i}" for j in range(40)) for i in range(6)]
    hour = 3_600_000
    with Detector(tmp_path / "idx", retention="2h", max_documents=4) as detector:
        detector.add_many(Document(f"d{i}", t, i * hour) for i, t in enumerate(texts[:5]))
        # Newest four (d1..d4), and within two hours of the clock (d2, d3, d4 at 2..4 h).
        assert [detector.query(t).is_duplicate for t in texts[:5]] == [
            False, False, True, True, True,
        ]  # fmt: skip
        assert detector.index.stats().held == 3
    with Detector(tmp_path / "idx") as reopened:  # the stored retention is kept
        assert reopened.index.retention.window == 7200
        assert reopened.index.retention.max_documents == 4
        assert reopened.query(texts[2]).is_duplicate
    with pytest.raises(ConfigError, match="retention"):
        Detector(retention="two hours")


@pytest.mark.parametrize("zero", [0, "0", "0d", "0h"])
def test_a_zero_retention_is_a_config_error(zero: str | int) -> None:
    with pytest.raises(ConfigError, match=r"window of zero.*write 'none'"):
        Detector(retention=zero)


def test_a_window_over_documents_without_a_time_warns_once_per_detector() -> None:
    texts = [" ".join(f"w{i}x{j} story{i}" for j in range(40)) for i in range(4)]
    with Detector(retention="2h", batch_size=2) as detector:
        with pytest.warns(RetentionWarning, match="clock is unset") as caught:
            detector.add_many([("a", texts[0]), ("b", texts[1]), ("c", texts[2])])
            detector.add("d", texts[3])
        assert len(caught) == 1, "once per detector, not once per batch"
        assert "retention window 2h" in str(caught[0].message)
        assert caught[0].filename == __file__
    with Detector(retention="2h") as single, pytest.warns(RetentionWarning) as caught:
        single.add("a", texts[0])
    assert caught[0].filename == __file__
    assert issubclass(RetentionWarning, UserWarning)
    assert issubclass(RetentionWarning, StreamDedupError)


def test_documents_with_a_time_or_no_window_do_not_warn() -> None:
    texts = [" ".join(f"w{i}x{j} story{i}" for j in range(40)) for i in range(4)]
    hour = 3_600_000
    with Detector(retention="2h", batch_size=2) as timed:  # warnings are errors here
        # Some documents without a time take the stream's clock: no warning.
        timed.add_many([Document("a", texts[0], hour), Document("b", texts[1])])
        assert timed.index.timeline.clock == 3600
    with Detector(max_documents=2) as counted:
        counted.add_many((f"d{i}", t) for i, t in enumerate(texts))
    with Detector(retention="none") as unbounded:
        unbounded.add("a", texts[0])
