"""The layers hold: the core and the package's top level load no infrastructure.

``stream_dedup.core`` is the pure detector, usable without a database or a message
broker, and ``import stream_dedup`` only names its exports (they are loaded on first use),
so neither may bring in the RocksDB binding or the Kafka client. Each import runs in a
fresh interpreter: in this one, other tests have long loaded both. And the index owns its
bytes: its key and record encodings are imported by no module outside it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Modules the core and the package's top level must not load.
INFRASTRUCTURE = ("rocksdict", "confluent_kafka")


def loaded_after(statement: str) -> list[str]:
    """The :data:`INFRASTRUCTURE` modules in ``sys.modules`` after ``statement``, run alone."""
    probe = (
        f"import sys\n{statement}\n"
        "import json\n"
        f"print(json.dumps([m for m in {INFRASTRUCTURE!r} if m in sys.modules]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    loaded: list[str] = json.loads(run.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "statement",
    [
        "import stream_dedup.core",
        "import stream_dedup",
        "import stream_dedup; stream_dedup.DedupConfig; stream_dedup.Document",
        "from stream_dedup.core import config, normalize, shingles, signature, sketch, match",
    ],
)
def test_the_core_and_the_package_load_neither_rocksdb_nor_kafka(statement: str) -> None:
    assert loaded_after(statement) == []


def test_the_probe_sees_what_an_import_loads() -> None:
    """The check above would catch a leak: the RocksDB backend does load RocksDB."""
    assert loaded_after("import stream_dedup.index.rocks") == ["rocksdict"]


#: The index's byte layout and value encodings: the index owns its bytes.
ENCODINGS = {"stream_dedup.index.keys", "stream_dedup.index.records"}


def _imported(tree: ast.AST) -> set[str]:
    """The modules an import statement of ``tree`` names (``from a import b``: ``a.b`` too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_index_encodings_are_imported_only_inside_the_index() -> None:
    package = ROOT / "stream_dedup"
    outside = [p for p in package.rglob("*.py") if (package / "index") not in p.parents]
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imported(ast.parse(p.read_text())) & ENCODINGS)
        for p in outside
    }
    assert {p: m for p, m in offenders.items() if m} == {}
