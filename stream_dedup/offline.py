"""The offline path: JSON Lines in stream order -> one verdict line per document.

The same :class:`~stream_dedup.dedup.Deduplicator` as the service, fed in batches: each
batch is decided against everything before it and committed in one write, so a run on a
persistent index can be interrupted and continued, and a later run on more input carries
on from the index.

Ctrl-C (SIGINT) stops a run between batches: a batch being decided, committed and written
when it arrives is finished first, and the run then raises ``KeyboardInterrupt``; while
the run waits for input it stops at once (see :class:`InterruptBetweenBatches`).

Input is JSON Lines from a file or standard input, plain or gzip-compressed, with or
without a UTF-8 byte order mark (:mod:`stream_dedup.input_files`).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import IO, Any, Literal

from stream_dedup.decode import DocumentFormat, document_from_json
from stream_dedup.dedup import Deduplicator, compiling_notice
from stream_dedup.errors import DecodeError, InputError
from stream_dedup.index.retention import NO_CLOCK, format_duration
from stream_dedup.input_files import open_input as open_input
from stream_dedup.input_files import output_over_input as output_over_input
from stream_dedup.models import Document, Verdict

OnError = Literal["skip", "fail"]


@dataclass(slots=True)
class RunSummary:
    """Counts of an offline run, printed at the end."""

    documents: int = 0
    duplicates: int = 0
    empty: int = 0
    replayed: int = 0
    #: Replayed ids whose normalised text no revision of the id had (``revisions =
    #: "replay"`` only), and documents decided as a new revision of their id.
    mismatched_repeats: int = 0
    revisions: int = 0
    malformed: int = 0
    candidates: int = 0
    verifications: int = 0
    truncated_lookups: int = 0
    seconds: float = 0.0
    malformed_lines: list[int] = field(default_factory=list)
    #: Malformed lines per :attr:`DecodeError.reason <stream_dedup.errors.DecodeError.reason>`.
    malformed_reasons: dict[str, int] = field(default_factory=dict)
    #: Documents decided without a time, and the batches decided under a retention window
    #: with no document time at all (:attr:`BatchStats.window_without_time
    #: <stream_dedup.dedup.BatchStats.window_without_time>`).
    untimed: int = 0
    batches_without_time: int = 0
    #: The retention window in force (seconds; 0: none) and the stream's clock after the run.
    window: int = 0
    clock_set: bool = False

    @property
    def rate(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0

    @property
    def nothing_read(self) -> bool:
        """Every non-blank line was malformed: the run decided nothing."""
        return self.documents == 0 and self.malformed > 0

    def render(self) -> str:
        dup_pct = 100.0 * self.duplicates / self.documents if self.documents else 0.0
        lines = [
            f"documents   {self.documents}",
            f"duplicates  {self.duplicates} ({dup_pct:.1f}%)",
            f"unique      {self.documents - self.duplicates}",
            f"empty       {self.empty}",
            f"replayed    {self.replayed} (ids seen before with the same text: their verdict "
            "again)",
            f"revisions   {self.revisions} (ids seen before with another text: decided again)",
            f"mismatched  {self.mismatched_repeats} (replayed ids with another text, under "
            "revisions = replay)",
            f"malformed   {self.malformed}",
            f"time        {self.seconds:.2f} s ({self.rate:,.0f} docs/s)",
        ]
        return "\n".join(lines)


class MalformedLineError(InputError):
    """A malformed input line under ``on_error="fail"``."""

    def __init__(self, line_no: int, error: DecodeError) -> None:
        super().__init__(f"line {line_no}: {error}")
        self.line_no = line_no
        self.error = error


#: Malformed lines reported one by one; a wrong --id-field on a large file would
#: otherwise print a line for every document before the run's summary says why.
MALFORMED_SHOWN = 20


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
            reasons = summary.malformed_reasons
            reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
            if summary.malformed <= MALFORMED_SHOWN:
                print(f"line {line_no}: skipped, {exc}", file=report)
            elif summary.malformed == MALFORMED_SHOWN + 1:
                print(
                    f"more malformed lines: counted, not shown (the first {MALFORMED_SHOWN} are)",
                    file=report,
                )


def batched(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    batch: list[Document] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def verdict_line(v: Verdict) -> str:
    """One output line: the event fields (``revision`` and ``previous`` from an id's
    second text on), plus ``empty`` and ``replayed`` when true."""
    body = v.to_json()
    if v.empty:
        body["empty"] = True
    if v.replayed:
        body["replayed"] = True
    return json.dumps(body, ensure_ascii=False)


class InterruptBetweenBatches:
    """SIGINT handling for a run over batches (a context manager; SIGINT's handler inside).

    Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when the
    signal arrives: in a compiled kernel, in a call into RocksDB, in a finaliser, places
    where an exception can be turned into another or dropped. So while a batch is being
    decided, committed and written (:attr:`in_batch`), SIGINT only records the request,
    and :meth:`check` raises ``KeyboardInterrupt`` once the batch is whole. Outside a
    batch (the run reading or waiting for input) it raises at once, so a run blocked on
    standard input stops; a second SIGINT raises at once wherever it lands.

    The handler is installed from the main thread only (Python delivers signals there);
    elsewhere the context does nothing and ``KeyboardInterrupt`` behaves as usual.
    """

    def __init__(self) -> None:
        self.requested = False
        self.in_batch = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptBetweenBatches:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            return self
        self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._installed:
            # A handler installed outside Python reads as None: SIGINT's Python default.
            signal.signal(
                signal.SIGINT,
                signal.default_int_handler if self._previous is None else self._previous,
            )

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        again = self.requested
        self.requested = True
        if again or not self.in_batch:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if SIGINT arrived (also one whose exception was
        raised and lost on the way)."""
        if self.requested:
            raise KeyboardInterrupt


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
    notice: IO[str] | None = None,
) -> RunSummary:
    """Decide every document of ``lines`` in order and write one verdict line each.

    The verdicts of a batch are written, and ``out`` flushed, after the batch's commit:
    what ``out`` holds is always whole batches that the index holds too. SIGINT stops the
    run between batches with ``KeyboardInterrupt`` (see :class:`InterruptBetweenBatches`).
    ``notice`` is told before the first batch when that batch must compile the kernels
    (:func:`~stream_dedup.dedup.compiling_notice`): asked only then, as the first batch,
    the largest, settles whether the run loads numba at all.
    """
    summary = RunSummary()
    start = time.perf_counter()
    last_shown = 0.0
    with InterruptBetweenBatches() as interrupts:
        for batch in batched(read_documents(lines, fmt, summary, on_error, report), batch_size):
            interrupts.in_batch = True
            if (
                notice is not None
                and (said := compiling_notice(len(batch), dedup.config.containment > 0)) is not None
            ):
                print(said, file=notice, flush=True)
            notice = None
            result = dedup.process(batch)
            for v in result.verdicts:
                out.write(verdict_line(v))
                out.write("\n")
                summary.duplicates += v.is_duplicate
                summary.empty += v.empty
            out.flush()
            interrupts.in_batch = False
            interrupts.check()
            summary.documents += len(batch)
            summary.replayed += result.stats.replayed
            summary.mismatched_repeats += result.stats.mismatched_repeats
            summary.revisions += result.stats.revisions
            summary.candidates += sum(result.stats.candidates)
            summary.verifications += sum(result.stats.verifications)
            summary.truncated_lookups += result.stats.truncated_lookups
            summary.untimed += result.stats.untimed
            summary.batches_without_time += result.stats.window_without_time
            now = time.perf_counter()
            if progress is not None and now - last_shown > 0.5:
                last_shown = now
                rate = summary.documents / (now - start)
                progress.write(
                    f"\r{summary.documents:,} documents, {summary.duplicates:,} duplicates, "
                    f"{rate:,.0f} docs/s"
                )
                progress.flush()
        interrupts.check()  # one that arrived as the input ended
    if progress is not None and summary.documents:
        progress.write("\n")
    summary.seconds = time.perf_counter() - start
    summary.window = dedup.index.retention.window
    summary.clock_set = dedup.index.timeline.clock != NO_CLOCK
    return summary


def no_time_warning(summary: RunSummary, time_field: str) -> str | None:
    """The warning for a run whose retention window had no time to measure (one line).

    Said when a window is in force and the documents of at least one batch all lacked a
    time (``time_field`` missing or unreadable in every one, or no field given): the
    window then cannot expire them on time, and while the stream's clock was never set
    it expires nothing. Documents without a time among others that have one take the
    stream's clock as it stands, which is by design and not warned about.
    """
    if not (summary.window and summary.batches_without_time):
        return None
    held = format_duration(summary.window)
    clock = (
        "the stream's clock was never set, so nothing expired by time"
        if not summary.clock_set
        else "they took the stream's clock as it stood"
    )
    counts = f"{summary.untimed:,} of {summary.documents:,} documents had no time"
    if time_field:
        return (
            f"warning: retention window {held} is in force, but {counts}: field "
            f"{time_field!r} was missing or unreadable in every document of "
            f"{summary.batches_without_time} batch(es), and {clock}. Check --time-field: it "
            "must name a field holding epoch milliseconds or ISO-8601"
        )
    return (
        f"warning: the index's retention window {held} is in force, but no --time-field was "
        f"given, so {counts} and {clock}. Name the field that holds the documents' time "
        "with --time-field, or give --retention none to keep every document"
    )
