"""``stream-dedup check``: one JSON answer per input line, the index left as it was, on an
index another process holds, on Redis, and clear errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stream_dedup import Detector
from stream_dedup.cli.app import main
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.opener import RedisSettings
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document
from tests.cli.test_cli import OTHER, STORY, THIRD, near
from tests.conftest import fresh_namespace
from tests.test_api import everything

INDEXED = [("story", STORY), ("other", OTHER), ("story-rerun", near(STORY, 5))]
ASKED = [
    {"id": "q1", "text": near(STORY, 9)},
    {"id": "q2", "text": THIRD},
    {"id": "q3", "title": "Re:", "text": OTHER},
]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    with Detector(tmp_path / "index") as detector:
        detector.add_many(INDEXED)
    return tmp_path / "index"


@pytest.fixture
def asked(tmp_path: Path) -> Path:
    path = tmp_path / "asked.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ASKED), encoding="utf-8")
    return path


def test_answers_each_line_with_its_matches(index_dir: Path, asked: Path) -> None:
    before = everything(index_dir)
    code, out = run("check", str(asked), "--index", str(index_dir), "-k", "2")
    assert code == 0
    q1, q2, q3 = lines(out)
    with Detector(index_dir) as detector:
        expected = detector.check(ASKED[0]["text"], k=2)
        verdict = detector.query(ASKED[0]["text"])
    assert q1 == {"id": "q1", "matches": [m.to_json() for m in expected]}
    assert [m["id"] for m in q1["matches"]] == ["story", "story-rerun"]
    top = q1["matches"][0]
    assert (top["similarity"], top["relation"]) == (verdict.similarity, "near-duplicate")
    assert 0.85 < top["containment"] < 1 and 0.85 < top["reverse_containment"] < 1
    assert q2 == {"id": "q2", "matches": []}
    assert [m["id"] for m in q3["matches"]] == ["other"]
    assert everything(index_dir) == before


def test_reads_standard_input_and_answers_malformed_lines(
    index_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = f'{json.dumps(ASKED[0])}\n\nnot json\n{{"text": "no id"}}\n'.encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out = run("check", "--index", str(index_dir), "-k", "1")
    assert code == 0
    first, bad, no_id = lines(out)
    assert [m["id"] for m in first["matches"]] == ["story"]
    assert (bad["line"], bad["error"]) == (3, "invalid_json")
    assert (no_id["line"], no_id["error"]) == (4, "missing_id")
    err = capsys.readouterr().err
    assert "line 3: invalid_json" in err and "2 malformed line(s)" in err


def test_works_on_an_index_another_process_holds(index_dir: Path, asked: Path) -> None:
    """The service holds its index's lock while it runs: a check reads a view without it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from stream_dedup.index.opener import open_index; "
            "ix = open_index(sys.argv[1], None); print('open', flush=True); sys.stdin.read()",
            str(index_dir),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        code, out = run("check", str(asked), "--index", str(index_dir))
    finally:
        holder.communicate("", timeout=30)
    assert code == 0
    assert [m["id"] for m in lines(out)[0]["matches"]] == ["story", "story-rerun"]


def test_checks_a_shared_index_on_redis(redis_url: str, asked: Path) -> None:
    namespace = fresh_namespace()
    config = DedupConfig()
    index = open_index(RedisSettings(redis_url, namespace), IndexParams.of(config))
    try:
        Deduplicator(index, config).process([Document(i, t) for i, t in INDEXED])
    finally:
        index.close()
    code, out = run("check", str(asked), "--redis", redis_url, "--namespace", namespace)
    assert code == 0
    assert [m["id"] for m in lines(out)[0]["matches"]] == ["story", "story-rerun"]


def test_clear_errors(tmp_path: Path, index_dir: Path, asked: Path) -> None:
    assert run("check", str(asked), "--index", str(tmp_path / "none"))[0] == 3
    assert run("check", str(asked), "--index", str(index_dir), "-k", "0")[0] == 2
    assert run("check", str(tmp_path / "missing.jsonl"), "--index", str(index_dir))[0] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"doc": 1}\n{"doc": 2}\n')
    assert run("check", str(bad), "--index", str(index_dir))[0] == 1


def test_help_says_what_the_answer_holds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for word in ("--index", "--redis", "-k", "containment", "near-duplicate", "without"):
        assert word in text
