"""Start-up is part of every command: each imports only what it uses.

A fresh interpreter runs the command and lists which heavy modules it loaded. Timing
tests would be flaky on a busy machine; what the command imports is not (the times are
in docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dedup.cli import app
from stream_dedup.cli import stats as cli_stats
from stream_dedup.core import jit
from stream_dedup.index.redis_layout import DEFAULT_NAMESPACE

#: Modules no command's parser needs: the Kafka client, Redis, RocksDB, the compiler and
#: numpy, the metrics library, the service and the index.
HEAVY = (
    "confluent_kafka",
    "redis",
    "rocksdict",
    "numba",
    "numpy",
    "prometheus_client",
    "stream_dedup.service",
    "stream_dedup.index",
)
#: What ``dedup`` (an offline run) never needs.
SERVICE_ONLY = ("confluent_kafka", "redis", "prometheus_client", "stream_dedup.service")


def loaded_by(argv: list[str], cwd: Path) -> list[str]:
    """The modules of ``HEAVY`` loaded after ``main(argv)`` in a fresh interpreter."""
    script = (
        "import json, sys\n"
        "from stream_dedup.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, check=True
    )
    loaded: list[str] = json.loads(run.stderr.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["dedup", "--help"],
        ["tune", "--help"],
        ["stats", "--help"],
        ["run", "--help"],
        ["produce", "--help"],
        ["config", "check", "--help"],
    ],
)
def test_help_loads_no_heavy_module(argv: list[str], tmp_path: Path) -> None:
    assert loaded_by(argv, tmp_path) == []


def test_dedup_loads_nothing_of_the_service(tmp_path: Path) -> None:
    (tmp_path / "one.jsonl").write_text('{"id": "a", "text": "hello world"}\n')
    loaded = loaded_by(["dedup", "one.jsonl", "-o", "out.jsonl", "-q"], tmp_path)
    assert "numpy" in loaded  # it did run
    assert not set(loaded) & set(SERVICE_ONLY), loaded
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 1


def test_dedup_of_a_few_documents_loads_neither_numba_nor_rocksdb(tmp_path: Path) -> None:
    """A short run decides with the kernels' Python forms (stream_dedup.core.jit), in a
    memory index: loading numba and its cached kernels would take longer than the run."""
    texts = ["hello world", "a quick brown fox", "jumps over the lazy dog"]
    lines = [json.dumps({"id": str(i), "text": texts[i % 3]}) for i in range(12)]
    (tmp_path / "few.jsonl").write_text("\n".join(lines) + "\n")
    loaded = loaded_by(["dedup", "few.jsonl", "-o", "out.jsonl"], tmp_path)
    assert "numpy" in loaded
    assert not {"numba", "rocksdict"} & set(loaded), loaded
    verdicts = [json.loads(v) for v in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [v["verdict"] for v in verdicts] == ["unique"] * 3 + ["duplicate"] * 9
    assert [v["duplicate_of"] for v in verdicts[3:]] == ["0", "1", "2"] * 3


@pytest.mark.slow
def test_dedup_of_a_large_batch_loads_numba(tmp_path: Path) -> None:
    n = jit.SMALL_BATCH + 1
    lines = [json.dumps({"id": str(i), "text": f"text number {i}"}) for i in range(n)]
    (tmp_path / "many.jsonl").write_text("\n".join(lines) + "\n")
    loaded = loaded_by(["dedup", "many.jsonl", "-o", "out.jsonl", "-q"], tmp_path)
    assert "numba" in loaded
    assert (tmp_path / "out.jsonl").read_text().count("\n") == n


def test_the_detector_on_a_few_documents_loads_no_numba(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from stream_dedup import Detector\n"
        "with Detector() as d:\n"
        "    first = d.add('a', 'the quick brown fox jumps over the lazy dog')\n"
        "    second = d.add('b', 'The quick brown fox jumps over the lazy dog!')\n"
        "print(first.verdict, second.verdict, second.duplicate_of, 'numba' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert run.stdout.split() == ["unique", "duplicate", "a", "False"]


def test_the_namespace_default_is_the_index_layouts() -> None:
    assert cli_stats.DEFAULT_NAMESPACE == DEFAULT_NAMESPACE
    args = app.build_parser().parse_args(["stats", "--redis", "redis://x"])
    assert args.namespace == DEFAULT_NAMESPACE
