"""The command line, called as ``main(argv, out)``: exit codes, output lines, messages."""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Rdict

from stream_dedup.cli.app import build_parser, main

Capsys = pytest.CaptureFixture[str]


def article(seed: int, words: int = 120) -> str:
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(words)
    )


def near(text: str, seed: int) -> str:
    """``text`` with three words replaced (Jaccard about 0.9)."""
    rng = random.Random(seed)
    words = text.split(" ")
    for i in rng.sample(range(len(words)), 3):
        words[i] = "X" * (4 + i % 3)
    return " ".join(words)


STORY, OTHER, THIRD = article(1), article(2), article(3)

RECORDS: list[dict[str, Any]] = [
    {"id": "a", "title": "Budget approved", "text": STORY},
    {"id": "b", "title": "Storm warning", "text": OTHER},
    {"id": "a-copy", "title": "Budget approved", "text": near(STORY, 1)},
    {"id": "hi", "text": "Hi!"},
    {"id": "hi-again", "title": "HI!"},
    {"id": "blank", "title": "   "},
]


def jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def read_verdicts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


FIELDS = ["id", "verdict", "duplicate_of", "similarity", "cluster_id"]


def test_dedup_writes_one_verdict_line_per_document(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    dst = tmp_path / "verdicts.jsonl"
    code, _ = run("dedup", str(src), "-o", str(dst))
    assert code == 0
    lines = read_verdicts(dst)
    assert [list(v) for v in lines] == [FIELDS] * 5 + [[*FIELDS, "empty"]]
    assert [(v["id"], v["verdict"], v["duplicate_of"], v["cluster_id"]) for v in lines] == [
        ("a", "unique", None, "a"),
        ("b", "unique", None, "b"),
        ("a-copy", "duplicate", "a", "a"),
        ("hi", "unique", None, "hi"),
        ("hi-again", "duplicate", "hi", "hi"),
        ("blank", "unique", None, "blank"),
    ]
    assert 0.8 <= lines[2]["similarity"] < 1.0
    assert lines[4]["similarity"] == 1.0
    assert lines[5]["empty"] is True
    err = capsys.readouterr().err
    assert "documents   6" in err
    assert "duplicates  2 (33.3%)" in err
    assert "empty       1" in err
    assert "docs/s" in err


def test_dedup_quiet_and_progress(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    assert run("dedup", str(src), "-o", str(tmp_path / "o1"), "-q")[0] == 0
    assert capsys.readouterr().err == ""
    assert run("dedup", str(src), "-o", str(tmp_path / "o2"), "-q", "--progress")[0] == 0
    assert "6 documents, 2 duplicates" in capsys.readouterr().err


def test_dedup_index_persists_and_a_second_run_continues(tmp_path: Path, capsys: Capsys) -> None:
    index = tmp_path / "index"
    first = write(tmp_path / "one.jsonl", jsonl(RECORDS[:2]))
    code, _ = run("dedup", str(first), "-o", str(tmp_path / "v1"), "--index", str(index))
    assert code == 0
    v1 = read_verdicts(tmp_path / "v1")
    capsys.readouterr()

    second = write(
        tmp_path / "two.jsonl",
        jsonl(
            [
                {"id": "a", "text": "edited content under a known id"},  # a new revision
                {"id": "c", "text": near(OTHER, 2)},  # decided against run one's b
                {"id": "d", "text": THIRD},
            ]
        ),
    )
    code, _ = run("dedup", str(second), "-o", str(tmp_path / "v2"), "--index", str(index))
    assert code == 0
    v2 = read_verdicts(tmp_path / "v2")
    assert (v2[0]["verdict"], v2[0]["revision"]) == ("unique", 2)  # decided again
    assert len(v2[0]["previous"]) == 16 and "revision" not in v1[0]
    assert "replayed" not in v1[0] and "replayed" not in v2[0] and "replayed" not in v2[1]
    assert (v2[1]["verdict"], v2[1]["duplicate_of"], v2[1]["cluster_id"]) == ("duplicate", "b", "b")
    assert v2[2]["verdict"] == "unique"
    err = capsys.readouterr().err
    assert "replayed    0" in err
    assert "revisions   1" in err  # a's text is not the first run's
    assert "documents   3" in err

    # the first run again: a's first text replays revision 1, b replays as before
    code, _ = run("dedup", str(first), "-o", str(tmp_path / "v3"), "--index", str(index))
    assert code == 0
    assert read_verdicts(tmp_path / "v3") == [{**v, "replayed": True} for v in v1]
    assert "replayed    2" in capsys.readouterr().err

    code, out = run("stats", "--index", str(index))
    assert code == 0
    assert "documents           5\n" in out  # two + three new; replays add nothing
    assert "duplicates          1\n" in out


def test_malformed_lines_are_reported_and_skipped(tmp_path: Path, capsys: Capsys) -> None:
    lines = [
        json.dumps(RECORDS[0]),
        '{"id": "broken", "text": ',
        json.dumps(RECORDS[1]),
        json.dumps({"text": "no id"}),
        "",
        json.dumps({"id": "n", "text": 5}),
        json.dumps(RECORDS[3]),
    ]
    src = write(tmp_path / "in.jsonl", "\n".join(lines) + "\n")
    dst = tmp_path / "out.jsonl"
    code, _ = run("dedup", str(src), "-o", str(dst))
    assert code == 0
    assert [v["id"] for v in read_verdicts(dst)] == ["a", "b", "hi"]
    err = capsys.readouterr().err
    assert "line 2: skipped, invalid_json" in err
    assert "line 4: skipped, missing_id" in err
    assert "line 6: skipped, invalid_content" in err
    assert "line 5" not in err  # a blank line is not a record
    assert "malformed   3" in err


def test_malformed_line_fails_the_run_on_request(tmp_path: Path, capsys: Capsys) -> None:
    lines = [json.dumps(RECORDS[0]), json.dumps(RECORDS[1]), "[1, 2]", json.dumps(RECORDS[3])]
    src = write(tmp_path / "in.jsonl", "\n".join(lines) + "\n")
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "out"), "--on-error", "fail")
    assert code == 1
    err = capsys.readouterr().err
    assert "error: line 3: not_an_object" in err
    assert "--on-error skip" in err


def test_invalid_utf8_line_is_reported_with_its_number(tmp_path: Path, capsys: Capsys) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": "x", "text": "ok"}\n{"id": "y", "text": "\xff"}\n')
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "out"))
    assert code == 0
    assert "line 2: skipped, invalid_utf8" in capsys.readouterr().err


def test_dedup_reads_stdin_and_writes_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    data = jsonl(RECORDS[:3]).replace("\n", "\r\n").encode()  # CRLF input too
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out = run("dedup", "-", "-o", "-", "-q")
    assert code == 0
    verdicts = [json.loads(line) for line in out.splitlines()]
    assert [v["verdict"] for v in verdicts] == ["unique", "unique", "duplicate"]
    assert capsys.readouterr().out == ""  # everything went to main's out stream


def test_custom_id_and_content_fields(tmp_path: Path) -> None:
    records = [{"key": 1, "body": STORY}, {"key": 2, "body": near(STORY, 5), "title": "x"}]
    src = write(tmp_path / "in.jsonl", jsonl(records))
    dst = tmp_path / "out.jsonl"
    args = ["dedup", str(src), "-o", str(dst), "-q", "--id-field", "key"]
    assert run(*args, "--content-fields", "body")[0] == 0
    assert [(v["id"], v["verdict"]) for v in read_verdicts(dst)] == [
        ("1", "unique"),
        ("2", "duplicate"),
    ]


def test_index_mismatch_exits_3_naming_the_key(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS[:2]))
    index = str(tmp_path / "index")
    assert run("dedup", str(src), "-o", str(tmp_path / "o"), "--index", index, "-q")[0] == 0
    capsys.readouterr()
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "o"), "--index", index, "--seed", "2")
    assert code == 3
    err = capsys.readouterr().err
    assert "seed: index has 1, asked for 2" in err
    assert "stream-dedup stats --index" in err
    code, _ = run("dedup", str(src), "-o", str(tmp_path / "o"), "--index", index, "-k", "4")
    assert code == 3
    assert "shingle_k: index has 5, asked for 4" in capsys.readouterr().err


def test_rerun_without_flags_uses_the_index_parameters(tmp_path: Path, capsys: Capsys) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS[:3]))
    index = str(tmp_path / "index")
    first = [
        *("dedup", str(src), "-o", str(tmp_path / "o"), "--index", index, "-q"),
        *("--threshold", "0.7", "--verify", "signature", "--index-policy", "uniques"),
    ]
    assert run(*first)[0] == 0
    more = write(tmp_path / "more.jsonl", jsonl([{"id": "z", "text": near(STORY, 9)}]))
    assert run("dedup", str(more), "-o", str(tmp_path / "o2"), "--index", index, "-q")[0] == 0
    assert read_verdicts(tmp_path / "o2")[0]["duplicate_of"] == "a"
    code, out = run("stats", "--index", index)
    assert code == 0
    assert "threshold           0.7\n" in out
    assert "verification        signature\n" in out
    assert "index policy        uniques\n" in out
    assert "indexed             2\n" in out  # a and b; the two duplicates were not indexed


def test_tune_prints_plan_table_knee_and_unused() -> None:
    code, out = run("tune", "--threshold", "0.8", "--num-perm", "128")
    assert code == 0
    assert "bands b            18\n" in out
    assert "rows r             7\n" in out
    assert "P(candidate | T)   0.9855\n" in out
    assert "S-curve knee       0.662" in out
    assert "unused hashes      2\n" in out
    assert "      0.80        0.9855  <- threshold" in out
    assert "      0.50        0.1317" in out
    assert "      1.00        1.0000" in out
    assert "datasketch's optimisation picks b=9, r=13: P(candidate | T) = 0.3988\n" in out


def test_tune_explicit_bands_and_errors(capsys: Capsys) -> None:
    code, out = run("tune", "--bands", "20", "--rows", "6")
    assert code == 0
    assert "bands b            20\n" in out
    assert "explicit --bands/--rows" in out
    assert "unused hashes      8\n" in out
    assert run("tune", "--bands", "20", "--rows", "7")[0] == 2
    assert "exceeds num_perm" in capsys.readouterr().err
    assert run("tune", "--threshold", "0.05", "--num-perm", "16")[0] == 2
    assert "raise --num-perm" in capsys.readouterr().err
    assert run("tune", "--bands", "20")[0] == 2
    assert "both bands and rows" in capsys.readouterr().err


def test_tune_plot_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "curve.png"
    code, out = run("tune", "--plot", str(png))
    assert code == 0
    assert f"S-curve written to {png}" in out
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000


def test_stats_prints_parameters_counts_and_size(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    index = tmp_path / "index"
    assert run("dedup", str(src), "-o", str(tmp_path / "o"), "--index", str(index), "-q")[0] == 0
    code, out = run("stats", "--index", str(index))
    assert code == 0
    assert f"index               {index}\n" in out
    assert "bands x rows        18 x 7\n" in out
    assert "shingles            char 5-grams (shingler v1)\n" in out
    assert "signature           oph-optimal-densification-v1, K=128, seed=1\n" in out
    assert "documents           6\n" in out
    assert "indexed             5\n" in out
    assert "duplicates          2\n" in out
    assert "empty               1\n" in out
    size_line = next(line for line in out.splitlines() if line.startswith("size on disk"))
    size = int(size_line.split()[3].replace(",", ""))
    assert size > 1000
    assert "format version      6 (compressed text)\n" in out
    assert "payload dictionary  none (yet)\n" in out
    per_doc = next(line for line in out.splitlines() if line.startswith("bytes/document"))
    assert per_doc == f"bytes/document      {size / 5:,.0f} per held document"


def test_stats_on_a_directory_without_an_index(tmp_path: Path, capsys: Capsys) -> None:
    assert run("stats", "--index", str(tmp_path))[0] == 3
    assert "holds no index" in capsys.readouterr().err
    plain = tmp_path / "plain-rocksdb"
    Rdict(str(plain)).close()
    assert run("stats", "--index", str(plain))[0] == 3
    assert "not a stream-dedup index" in capsys.readouterr().err


def subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_core_subcommands_exist() -> None:
    assert {"dedup", "tune", "stats"} <= set(subcommands())


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in subcommands()])
def test_every_help_exits_0(argv: list[str], capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv, out=io.StringIO())
    assert info.value.code == 0
    assert "usage: stream-dedup" in capsys.readouterr().out


def test_version_prints_the_package_version(capsys: Capsys) -> None:
    import stream_dedup

    with pytest.raises(SystemExit) as info:
        main(["--version"], out=io.StringIO())
    assert info.value.code == 0
    assert capsys.readouterr().out == f"stream-dedup {stream_dedup.__version__}\n"


def test_missing_input_file_is_a_clear_error(tmp_path: Path, capsys: Capsys) -> None:
    code, _ = run("dedup", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "out"))
    assert code == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """``stream-dedup generate | head -1``: no error and no traceback when head exits."""
    done = subprocess.run(
        f"{sys.executable} -m stream_dedup.cli generate -n 20000 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.count("\n") == 1
    assert done.stderr == ""


def test_stats_reads_an_index_another_process_writes_without_changing_it(
    tmp_path: Path,
) -> None:
    """The service holds its index's lock while it runs; ``stats`` reads a frozen view
    without the lock and writes nothing there (so a read-only directory serves too)."""
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    index = tmp_path / "index"
    assert run("dedup", str(src), "-o", str(tmp_path / "o"), "--index", str(index), "-q")[0] == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from stream_dedup.index.opener import open_index; "
            "ix = open_index(sys.argv[1], None); print('open', flush=True); sys.stdin.read()",
            str(index),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in index.iterdir()}
        code, out = run("stats", "--index", str(index))
        after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in index.iterdir()}
    finally:
        holder.communicate("", timeout=30)
    assert code == 0, out
    assert "documents           6\n" in out
    assert after == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_stats_reads_an_index_in_a_read_only_directory(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", jsonl(RECORDS))
    index = tmp_path / "index"
    assert run("dedup", str(src), "-o", str(tmp_path / "o"), "--index", str(index), "-q")[0] == 0
    files = [index, *index.iterdir()]
    for path in files:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        code, out = run("stats", "--index", str(index))
    finally:
        for path in files:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert code == 0, out
    assert "documents           6\n" in out
