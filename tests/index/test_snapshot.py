"""Snapshots of stopped and running indexes, and restoring them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

import pytest

from stream_dedup.cli.app import main
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import IndexLockedError, IndexStoreError
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.index.snapshot import SnapshotInfo, _copy_live, restore, snapshot
from stream_dedup.models import Document


def _build(path: Path, n: int = 50, retention: Retention | None = None) -> list[str]:
    cfg = DedupConfig()
    index = open_index(path, IndexParams.of(cfg), retention=retention)
    try:
        docs = [
            Document(f"d{i}", f"story number {i % 10} about the harbour and the river")
            for i in range(n)
        ]
        dedup = Deduplicator(index, cfg)
        verdicts = []
        for lo in range(0, n, 10):
            batch = docs[lo : lo + 10]
            verdicts += dedup.process(batch, offsets={("news", 0): lo + len(batch)}).verdicts
        return [v.verdict.value for v in verdicts]
    finally:
        index.close()


#: Probes of the built index: a copy of a held story, and one of a story expired under
#: RETENTION (held without it).
PROBES = [
    Document("p-held", "story number 5 about the harbour and the river"),
    Document("p-new", "a story about the mountains that no document of the index told"),
]
RETENTION = Retention(max_documents=12)


def _probe(path: Path) -> list[tuple[str, str | None]]:
    index = open_index(path, None)
    try:
        stats = index.stats()
        verdicts = Deduplicator(index, index.params.dedup_config()).decide(PROBES).verdicts
        return [(str(stats.held), None)] + [(v.verdict.value, v.duplicate_of) for v in verdicts]
    finally:
        index.close()


@pytest.mark.parametrize("retention", [None, RETENTION], ids=["all", "retention"])
def test_snapshots_of_an_index_decide_as_the_index_does(
    tmp_path: Path, retention: Retention | None
) -> None:
    _build(tmp_path / "idx", retention=retention)
    expected = _probe(tmp_path / "idx")
    snapshot(tmp_path / "idx", tmp_path / "checkpoint")
    assert _probe(tmp_path / "checkpoint") == expected
    # A live copy (the path taken while a service holds the index) copies every epoch.
    info = snapshot_live(tmp_path / "idx", tmp_path / "live")
    assert info.method.startswith("live copy")
    assert _probe(tmp_path / "live") == expected
    restore(tmp_path / "live", tmp_path / "restored")
    assert _probe(tmp_path / "restored") == expected
    assert expected[0][0] == ("12" if retention else "50")


def test_snapshot_of_stopped_index_is_a_checkpoint_with_everything(tmp_path: Path) -> None:
    _build(tmp_path / "idx")
    info = snapshot(tmp_path / "idx", tmp_path / "bak")
    assert info.method == "checkpoint"
    copy = open_index(tmp_path / "bak", None)
    try:
        assert copy.counter("documents") == 50
        assert copy.offsets() == {("news", 0): 50}
    finally:
        copy.close()


def test_snapshot_of_running_index_copies_a_consistent_state(tmp_path: Path) -> None:
    _build(tmp_path / "idx")
    holder = textwrap.dedent(
        f"""
        import sys, time
        from stream_dedup.index import open_index
        idx = open_index({str(tmp_path / "idx")!r}, None)
        print("open", flush=True)
        time.sleep(30)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        with pytest.raises(IndexLockedError):
            open_index(tmp_path / "idx", None)
        info = snapshot(tmp_path / "idx", tmp_path / "bak")
        assert info.method.startswith("live copy")
    finally:
        proc.kill()
        proc.communicate()
    copy = open_index(tmp_path / "bak", None)
    try:
        assert copy.counter("documents") == 50
        assert copy.offsets() == {("news", 0): 50}
    finally:
        copy.close()


def test_restore_refuses_to_overwrite_without_force_and_keeps_old(tmp_path: Path) -> None:
    _build(tmp_path / "idx", n=20)
    snapshot(tmp_path / "idx", tmp_path / "bak")
    _build(tmp_path / "other", n=5)
    with pytest.raises(IndexStoreError, match="--force"):
        restore(tmp_path / "bak", tmp_path / "other")
    restore(tmp_path / "bak", tmp_path / "other", force=True)
    assert (tmp_path / "other.replaced" / "CURRENT").exists()
    index = open_index(tmp_path / "other", None)
    try:
        assert index.counter("documents") == 20
    finally:
        index.close()


def test_snapshot_refuses_a_non_empty_target(tmp_path: Path) -> None:
    _build(tmp_path / "idx", n=3)
    (tmp_path / "bak").mkdir()
    (tmp_path / "bak" / "x").write_text("x")
    with pytest.raises(IndexStoreError, match="not empty"):
        snapshot(tmp_path / "idx", tmp_path / "bak")


def test_cli_snapshot_and_restore(tmp_path: Path) -> None:
    _build(tmp_path / "idx", n=10)
    out = StringIO()
    assert (
        main(["snapshot", "--index", str(tmp_path / "idx"), "--to", str(tmp_path / "b")], out=out)
        == 0
    )
    assert "10" not in out.getvalue() or "keys" in out.getvalue()
    assert main(["restore", str(tmp_path / "b"), "--index", str(tmp_path / "r")], out=out) == 0
    assert main(["restore", str(tmp_path / "b"), "--index", str(tmp_path / "r")], out=out) == 3
    start = time.perf_counter()
    assert main(["stats", "--index", str(tmp_path / "r")], out=(stats := StringIO())) == 0
    assert time.perf_counter() - start < 10
    assert "documents           10" in stats.getvalue()


def test_forced_restores_never_delete_an_index_kept_aside(tmp_path: Path) -> None:
    _build(tmp_path / "bak-src", n=20)
    snapshot(tmp_path / "bak-src", tmp_path / "bak")
    _build(tmp_path / "idx", n=5)
    first = restore(tmp_path / "bak", tmp_path / "idx", force=True)
    assert first.replaced == str(tmp_path / "idx.replaced")
    second = restore(tmp_path / "bak", tmp_path / "idx", force=True)
    assert second.replaced == str(tmp_path / "idx.replaced.1")
    (tmp_path / "idx.replaced.2").mkdir()  # a name taken by something else is skipped
    third = restore(tmp_path / "bak", tmp_path / "idx", force=True)
    assert third.replaced == str(tmp_path / "idx.replaced.3")
    kept: dict[str, int] = {}
    for name in ("idx.replaced", "idx.replaced.1", "idx.replaced.3", "idx"):
        index = open_index(tmp_path / name, None)
        try:
            kept[name] = index.counter("documents")
        finally:
            index.close()
    assert kept == {"idx.replaced": 5, "idx.replaced.1": 20, "idx.replaced.3": 20, "idx": 20}


def test_cli_restore_says_where_the_old_index_is_kept(tmp_path: Path) -> None:
    _build(tmp_path / "idx", n=10)
    assert main(["snapshot", "--index", str(tmp_path / "idx"), "--to", str(tmp_path / "b")]) == 0
    args = ["restore", str(tmp_path / "b"), "--index", str(tmp_path / "idx"), "--force"]
    for aside in ("idx.replaced", "idx.replaced.1"):
        assert main(args, out=(out := StringIO())) == 0
        assert f"kept at {tmp_path / aside} " in out.getvalue()
        assert (tmp_path / aside / "CURRENT").exists()
    assert main(args[:-1], out=StringIO()) == 3  # without --force: refused


def snapshot_live(src: Path, dest: Path) -> SnapshotInfo:
    """The live copy :func:`snapshot` makes of a locked index, of an unlocked one."""
    return _copy_live(src, dest, None)
