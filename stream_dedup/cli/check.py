"""``stream-dedup check``: documents of a JSON Lines file checked against an index, which
is left as it was: for each, the earlier documents most similar to it, with their scores.

A RocksDB index is opened as a read-only view without its lock (as ``stats`` opens it), so
a running service may hold it; the answers are from the index as it was at that moment.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING

from stream_dedup.cli.stats import DEFAULT_NAMESPACE, PASSWORD_VARIABLE, open_for_reading

if TYPE_CHECKING:
    from stream_dedup.decode import DocumentFormat
    from stream_dedup.index.store import DedupIndex

#: Matches per document unless ``-k`` says otherwise (the Python API's default too).
DEFAULT_K = 5
#: Documents checked together: the index reads of a batch are a few batched reads.
_BATCH = 500


def cmd_check(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.decode import DocumentFormat
    from stream_dedup.dedup.check import check_k
    from stream_dedup.input_files import open_input, output_over_input

    check_k(args.k)
    if (clash := output_over_input(args.input, args.output)) is not None:
        print(f"error: {clash}", file=err)
        return 2
    fmt = DocumentFormat(args.id_field, tuple(args.content_fields.split(",")))
    index = open_for_reading(args)
    try:
        with ExitStack() as stack:
            source = open_input(args.input, stack)
            target: IO[str] = (
                out
                if args.output == "-"
                else stack.enter_context(Path(args.output).open("w", encoding="utf-8"))
            )
            answered, malformed = _run(index, source, target, fmt, args.k, err)
    finally:
        index.close()
    if malformed:
        print(f"warning: {malformed} malformed line(s) answered with their error", file=err)
    if malformed and not answered:
        print(
            f"error: no document could be read: check that --id-field ({args.id_field}) and "
            f"--content-fields ({args.content_fields}) name fields the records have",
            file=err,
        )
        return 1
    return 0


def _run(
    index: DedupIndex, source: IO[bytes], target: IO[str], fmt: DocumentFormat, k: int, err: IO[str]
) -> tuple[int, int]:
    """Answer every non-blank line of ``source`` in order, one JSON line each: the checked
    documents and the malformed lines (their line number and error) counted."""
    from stream_dedup.decode import document_from_json
    from stream_dedup.dedup.check import answer, check_texts
    from stream_dedup.errors import DecodeError
    from stream_dedup.models import Document

    config = index.params.dedup_config()
    plan = config.band_plan()
    pending: list[Document | dict[str, object]] = []
    answered = malformed = 0

    def flush() -> None:
        docs = [p for p in pending if isinstance(p, Document)]
        found = iter(check_texts(index, config, plan, [d.content for d in docs], k))
        for p in pending:
            line = answer(p.id, next(found)) if isinstance(p, Document) else p
            target.write(json.dumps(line, ensure_ascii=False) + "\n")
        pending.clear()

    for number, raw in enumerate(source, start=1):
        if not raw.strip():
            continue
        try:
            pending.append(document_from_json(raw, fmt))
            answered += 1
        except DecodeError as exc:
            malformed += 1
            print(f"line {number}: {exc.reason}: {exc.detail}", file=err)
            pending.append({"line": number, "error": exc.reason, "detail": exc.detail})
        if len(pending) >= _BATCH:
            flush()
    flush()
    return answered, malformed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``check``: documents checked against an index without adding them."""
    p = sub.add_parser(
        "check",
        help="list the indexed documents most similar to each document, adding nothing",
        description="Check each document of a JSON Lines file (one object with an id and "
        "content fields per line) against an index, without adding it: one JSON line per "
        'document, {"id": ..., "matches": [{"id", "similarity", "containment", '
        '"reverse_containment", "cluster_id", "relation"}, ...]}, most similar first. '
        "similarity is the exact Jaccard similarity; containment the share of the "
        "document's shingles found in the match, reverse_containment the share of the "
        "match's found in the document; relation is near-duplicate at or above the "
        "index's threshold, else similar. A malformed line is answered with its line "
        "number and error. A RocksDB index is read without its lock, as it was at that "
        "moment: a running service may hold it.",
    )
    p.add_argument("input", nargs="?", default="-", help="JSON Lines file, or - (default)")
    p.add_argument("-o", "--output", default="-", help="answers file (JSON Lines), or - (default)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="RocksDB index directory")
    where.add_argument(
        "--redis",
        metavar="URL",
        help="a shared index on Redis: redis://host:port/db (rediss:// for TLS); the "
        f"password, if any, from {PASSWORD_VARIABLE} or the URL",
    )
    p.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help=f"with --redis (default {DEFAULT_NAMESPACE})"
    )
    p.add_argument(
        "--tls-ca-file", metavar="PATH", help="with a rediss:// URL: the CA certificate to trust"
    )
    p.add_argument(
        "-k",
        type=int,
        default=DEFAULT_K,
        help=f"matches per document, at most (default {DEFAULT_K})",
    )
    p.add_argument("--id-field", default="id", help="field holding the document id (id)")
    p.add_argument(
        "--content-fields", default="title,text", help="comma-separated text fields (title,text)"
    )
    p.set_defaults(func=cmd_check)
