"""The offline path: JSON Lines in stream order -> one verdict line per document.

The same :class:`~stream_dedup.dedup.Deduplicator` as the service, fed in batches: each
batch is decided against everything before it and committed in one write, so a run on a
persistent index can be interrupted and continued, and a later run on more input carries
on from the index.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from stream_dedup.core.config import DocumentFormat
from stream_dedup.decode import document_from_json
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import DecodeError
from stream_dedup.models import Document, Verdict

OnError = Literal["skip", "fail"]


@dataclass(slots=True)
class RunSummary:
    """Counts of an offline run, printed at the end."""

    documents: int = 0
    duplicates: int = 0
    empty: int = 0
    replayed: int = 0
    malformed: int = 0
    candidates: int = 0
    verifications: int = 0
    truncated_lookups: int = 0
    seconds: float = 0.0
    malformed_lines: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        dup_pct = 100.0 * self.duplicates / self.documents if self.documents else 0.0
        lines = [
            f"documents   {self.documents}",
            f"duplicates  {self.duplicates} ({dup_pct:.1f}%)",
            f"unique      {self.documents - self.duplicates}",
            f"empty       {self.empty}",
            f"replayed    {self.replayed} (ids already in the index)",
            f"malformed   {self.malformed}",
            f"time        {self.seconds:.2f} s ({self.rate:,.0f} docs/s)",
        ]
        return "\n".join(lines)


class MalformedLineError(Exception):
    """A malformed input line under ``on_error="fail"``."""

    def __init__(self, line_no: int, error: DecodeError) -> None:
        super().__init__(f"line {line_no}: {error}")
        self.line_no = line_no
        self.error = error


def read_documents(
    lines: Iterable[bytes],
    fmt: DocumentFormat,
    summary: RunSummary,
    on_error: OnError,
    report: IO[str],
) -> Iterator[Document]:
    """Documents from JSON lines; malformed lines are reported (and skipped or fatal)."""
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield document_from_json(line.rstrip(b"\r\n"), fmt)
        except DecodeError as exc:
            if on_error == "fail":
                raise MalformedLineError(line_no, exc) from exc
            summary.malformed += 1
            summary.malformed_lines.append(line_no)
            print(f"line {line_no}: skipped, {exc}", file=report)


def batched(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    batch: list[Document] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def open_input(path: str, stack: ExitStack) -> IO[bytes]:
    """The binary input stream for a path argument: ``-`` is standard input."""
    if path == "-":
        return sys.stdin.buffer
    return stack.enter_context(Path(path).open("rb"))


def verdict_line(v: Verdict) -> str:
    body = v.to_json()
    if v.empty:
        body["empty"] = True
    return json.dumps(body, ensure_ascii=False)


def run_offline(
    dedup: Deduplicator,
    lines: Iterable[bytes],
    out: IO[str],
    *,
    fmt: DocumentFormat,
    batch_size: int = 1000,
    on_error: OnError = "skip",
    progress: IO[str] | None = None,
    report: IO[str] = sys.stderr,
) -> RunSummary:
    """Decide every document of ``lines`` in order and write one verdict line each."""
    summary = RunSummary()
    start = time.perf_counter()
    last_shown = 0.0
    for batch in batched(read_documents(lines, fmt, summary, on_error, report), batch_size):
        result = dedup.process(batch)
        for v in result.verdicts:
            out.write(verdict_line(v))
            out.write("\n")
            summary.duplicates += v.is_duplicate
            summary.empty += v.empty
        summary.documents += len(batch)
        summary.replayed += result.stats.replayed
        summary.candidates += sum(result.stats.candidates)
        summary.verifications += sum(result.stats.verifications)
        summary.truncated_lookups += result.stats.truncated_lookups
        now = time.perf_counter()
        if progress is not None and now - last_shown > 0.5:
            last_shown = now
            rate = summary.documents / (now - start)
            progress.write(
                f"\r{summary.documents:,} documents, {summary.duplicates:,} duplicates, "
                f"{rate:,.0f} docs/s"
            )
            progress.flush()
    if progress is not None and summary.documents:
        progress.write("\n")
    summary.seconds = time.perf_counter() - start
    return summary
