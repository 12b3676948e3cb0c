"""Digests of a fixed offline run: verdict lines, every index byte, and the events.

Run it on two checkouts (or before and after a refactoring) and compare the printed
lines: equal digests mean equal verdicts, an index holding the same keys and values, and
byte-identical Kafka events for the same input. It drives the installed ``stream-dedup``
command (``generate`` and ``dedup``), so it works across changes of the package's layout.

    python bench/fingerprint_run.py  # the ads of tests/data; --kijiji FILE for others

With ``--batch-size 16`` a run takes the kernels' Python path (:mod:`stream_dedup.core.jit`):
its digests must equal those of a compiled run, from this checkout or another. With
``--containment 0.8`` two more configurations decide with containment on (defaults, and
``--index-policy uniques``): a change meant to decide as before must keep those too.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict

#: The ads in this checkout's test data (tests/data/README.md).
KIJIJI = Path(__file__).resolve().parents[1] / "tests" / "data" / "kijiji_rent_rome.tsv.gz"


def _run(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "stream_dedup.cli", *args], check=True)


def _kijiji_jsonl(tsv: Path, target: Path) -> None:
    opener = gzip.open if tsv.suffix == ".gz" else open
    with opener(tsv, "rt", encoding="utf-8", errors="replace") as src, target.open("w") as out:
        next(src)
        for i, line in enumerate(src):
            cols = line.rstrip("\n").split("\t")
            text = " ".join(cols[:2])
            out.write(json.dumps({"id": f"k{i}", "text": text}) + "\n")


def _index_digest(path: Path) -> tuple[str, int]:
    """SHA-256 over every (family, key, value) in key order, and the number of keys."""
    opts = Options(raw_mode=True)
    families = Rdict.list_cf(str(path), opts)
    db = Rdict(
        str(path),
        opts,
        column_families={f: Options(raw_mode=True) for f in families if f != "default"},
        access_type=AccessType.read_only(),
    )
    h = hashlib.sha256()
    n = 0
    for family in sorted(families):
        view = db if family == "default" else db.get_column_family(family)
        for key, value in view.items():
            h.update(family.encode() + b"\0" + len(key).to_bytes(4, "little") + key + value)
            n += 1
        if view is not db:
            view.close()
    db.close()
    return h.hexdigest(), n


def _events_module() -> Any:
    for name in ("stream_dedup.service.events", "stream_dedup.events"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise SystemExit("no events module found")


def _events_digest(source: Path, verdicts: Path) -> str:
    """SHA-256 of the events the service would emit for these verdicts and messages."""
    events = _events_module()
    from stream_dedup.models import Verdict, VerdictKind

    h = hashlib.sha256()
    with source.open("rb") as src, verdicts.open() as out:
        for offset, (raw, line) in enumerate(zip(src, out, strict=True)):
            v = json.loads(line)
            verdict = Verdict(
                v["id"],
                VerdictKind(v["verdict"]),
                v["duplicate_of"],
                v["similarity"],
                v["cluster_id"],
                empty=bool(v.get("empty", False)),
            )
            value = raw.rstrip(b"\n")
            src_msg = events.Source("in", offset % 3, offset, 1_700_000_000_000 + offset,
                                    v["id"].encode(), value, [])  # fmt: skip
            rec = events.event(verdict, src_msg, events.document_json(value, text=False), "out")
            h.update(repr((rec.topic, rec.key, rec.value, rec.headers)).encode())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kijiji", type=Path, default=KIJIJI, help="the ads (default: tests/data's copy)"
    )
    parser.add_argument("-n", "--documents", type=int, default=20_000, help="generated docs")
    parser.add_argument(
        "--batch-size", default="700", help="dedup's batch (700; 16: the kernels' Python path)"
    )
    parser.add_argument(
        "--containment",
        default="",
        help="also decide with this containment setting (the configurations that verify "
        "exactly): its digests must be equal across changes that decide as before",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fingerprint-"))
    try:
        inputs = {"news": work / "news.jsonl", "kijiji": work / "kijiji.jsonl"}
        _run("generate", "-n", str(args.documents), "-o", str(inputs["news"]))
        _kijiji_jsonl(args.kijiji, inputs["kijiji"])
        for name, source in inputs.items():
            fields = "text" if name == "kijiji" else "title,text"
            configs = [
                [],
                ["--verify", "signature", "--index-policy", "uniques"],
                ["--shingle", "word", "-k", "3", "--threshold", "0.6"],
            ]
            if args.containment:
                configs += [["--containment", args.containment]]
                configs += [["--containment", args.containment, "--index-policy", "uniques"]]
            for number, extra in enumerate(configs):
                label = f"{name} {' '.join(extra) or 'defaults'}"
                index = work / f"index-{name}-{number}"
                out = work / f"out-{name}-{number}.jsonl"
                _run("dedup", str(source), "-o", str(out), "--index", str(index),
                     "--content-fields", fields, "--batch-size", args.batch_size,
                     "-q", *extra)  # fmt: skip
                verdicts = hashlib.sha256(out.read_bytes()).hexdigest()
                index_hash, keys = _index_digest(index)
                print(f"{label}: verdicts {verdicts[:16]}")
                print(f"{label}: index {index_hash[:16]} ({keys} keys)")
                print(f"{label}: events {_events_digest(source, out)[:16]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
