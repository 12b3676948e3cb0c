"""The ``stream-dedup`` command line. ``main(argv)`` returns the exit code (tests call it).

Exit codes: 0 success, 1 a run failed on its input (a malformed line with ``--on-error
fail``, or no line of the input could be read as a document), 2 usage or configuration
error, or an input that cannot be read (missing, unreadable, a corrupt gzip stream:
:class:`~stream_dedup.errors.InputError`), 3 index error, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING

import stream_dedup
from stream_dedup.cli import check as cli_check
from stream_dedup.cli import kafka as cli_kafka
from stream_dedup.cli import ops as cli_ops
from stream_dedup.cli import stats as cli_stats
from stream_dedup.cli.detector_options import add_detector_options, detector_config
from stream_dedup.cli.run import add_run_command
from stream_dedup.errors import (
    ConfigError,
    IndexStoreError,
    InputError,
    RecordRefusedError,
    StreamDedupError,
    TransactionError,
)

# Building the parser and parsing the arguments load only the light modules above: each
# command imports what it runs (numpy, numba, RocksDB, Redis, the Kafka client) itself.
if TYPE_CHECKING:
    from stream_dedup.core.config import DedupConfig
    from stream_dedup.index.store import DedupIndex
    from stream_dedup.offline import RunSummary


def _open_for_dedup(args: argparse.Namespace) -> tuple[DedupIndex, DedupConfig]:
    """The index of ``--index`` (in memory without it) and the configuration the flags
    settle over what it stores; the retention options are in force from its opening."""
    from stream_dedup.index.opener import open_or_create
    from stream_dedup.index.retention import RetentionChange

    retention = RetentionChange.of(args.retention, args.max_documents, "--retention")
    return open_or_create(
        args.index, lambda stored: detector_config(args, stored), retention=retention
    )


def cmd_dedup(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.decode import DocumentFormat
    from stream_dedup.dedup import Deduplicator
    from stream_dedup.index.retention import parse_duration
    from stream_dedup.input_files import open_input, output_over_input
    from stream_dedup.offline import MalformedLineError, no_time_warning, run_offline

    fmt = DocumentFormat(
        args.id_field, tuple(args.content_fields.split(",")), time_field=args.time_field or ""
    )
    if parse_duration(args.retention, "--retention") and not args.time_field:
        print(
            "error: --retention measures the documents' time: name the field that holds it "
            "with --time-field (epoch milliseconds or ISO-8601), or use --max-documents",
            file=err,
        )
        return 2
    if (clash := output_over_input(args.input, args.output)) is not None:
        print(f"error: {clash}", file=err)  # before the output is opened: it would empty it
        return 2
    index, config = _open_for_dedup(args)
    try:
        dedup = Deduplicator(index, config)
        show = err if (args.progress or (args.progress is None and err.isatty())) else None
        with ExitStack() as stack:
            source = open_input(args.input, stack)
            target: IO[str] = (
                out  # main's output stream: stdout unless a caller passes its own
                if args.output == "-"
                else stack.enter_context(Path(args.output).open("w", encoding="utf-8"))
            )
            summary = run_offline(
                dedup,
                source,
                target,
                fmt=fmt,
                batch_size=args.batch_size,
                on_error=args.on_error,
                progress=show,
                report=err,
                notice=None if args.quiet else err,
            )
    except MalformedLineError as exc:
        print(f"error: {exc}. Fix the line or rerun with --on-error skip.", file=err)
        return 1
    finally:
        index.close()
    if not args.quiet:
        print(summary.render(), file=err)
    if summary.nothing_read:
        print(_nothing_read(args, summary), file=err)
        return 1
    if (untimed := no_time_warning(summary, args.time_field or "")) is not None:
        print(untimed, file=err)
    if summary.malformed:
        print(
            f"warning: {summary.malformed} malformed line(s) skipped "
            f"({_reasons(summary)}; line numbers above)",
            file=err,
        )
    return 0


def _reasons(summary: RunSummary) -> str:
    """The malformed lines' reasons with their counts, most frequent first."""
    ranked = sorted(summary.malformed_reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{reason} {count}" for reason, count in ranked)


def _nothing_read(args: argparse.Namespace, summary: RunSummary) -> str:
    """What to do when every line of the input was malformed (a run that decided nothing).

    Almost always the fields or the format do not match the input, not the data itself.
    """
    source = "standard input" if args.input == "-" else args.input
    return (
        f"error: no document could be read from {source}: all {summary.malformed} non-blank "
        f"line(s) were malformed ({_reasons(summary)}). Check that --id-field "
        f"({args.id_field}) and --content-fields ({args.content_fields}) name fields the "
        "records have, and that the input is JSON Lines, one JSON object per line "
        "(plain or gzip-compressed)."
    )


def cmd_tune(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.cli.tune_report import plot_s_curve, render_report
    from stream_dedup.core.bands import datasketch_choice

    config = detector_config(args)
    plan = config.band_plan()
    print(render_report(plan, config.recall_at_threshold, config.bands > 0), file=out)
    ds = datasketch_choice(config.threshold, config.num_perm)
    print(
        f"\nfor comparison, datasketch's optimisation picks b={ds.bands}, r={ds.rows}: "
        f"P(candidate | T) = {ds.probability(config.threshold):.4f}",
        file=out,
    )
    if args.plot:
        plot_s_curve(plan, args.plot, compare=ds)
        print(f"S-curve written to {args.plot}", file=out)
    return 0


def cmd_generate(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.tools.generate import StreamSpec, write_jsonl

    spec = StreamSpec(documents=args.documents, rerun_rate=args.rerun_rate, seed=args.seed)
    if args.output == "-":
        count = write_jsonl(spec, out)
    else:
        with Path(args.output).open("w", encoding="utf-8") as target:
            count = write_jsonl(spec, target)
    print(f"wrote {count} records", file=err)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-dedup",
        description="Online near-duplicate detection for document streams.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {stream_dedup.__version__}"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_dedup(sub)
    _add_tune(sub)
    cli_stats.register(sub)
    cli_check.register(sub)
    _add_generate(sub)
    cli_ops.register(sub)
    cli_kafka.register(sub)
    add_run_command(sub)
    return parser


def _add_dedup(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``dedup``: a JSON Lines file decided in stream order."""
    p = sub.add_parser(
        "dedup",
        help="decide every document of a JSON Lines file against those before it",
        description="Read JSON Lines (one object with an id and content fields per line) in "
        "stream order and write one verdict line per document.",
    )
    p.add_argument("input", help="JSON Lines file, or - for standard input")
    p.add_argument("-o", "--output", required=True, help="verdicts file (JSON Lines), or -")
    p.add_argument("--index", help="RocksDB index directory (persists; reruns continue from it)")
    p.add_argument("--id-field", default="id", help="field holding the document id (id)")
    p.add_argument(
        "--content-fields", default="title,text", help="comma-separated text fields (title,text)"
    )
    p.add_argument(
        "--time-field",
        help="field holding the document's time (epoch ms or ISO-8601), for --retention",
    )
    p.add_argument(
        "--retention",
        metavar="DURATION",
        help="hold documents for this long on the documents' time (30d, 12h, none); "
        "default: what the index stores, else none",
    )
    p.add_argument(
        "--max-documents",
        type=int,
        metavar="N",
        help="hold at most the N newest documents (0: no limit); default: as stored",
    )
    p.add_argument("--batch-size", type=int, default=1000, help="documents per batch (1000)")
    p.add_argument(
        "--on-error",
        choices=["skip", "fail"],
        default="skip",
        help="malformed line: report it with its line number and skip it, or stop (skip)",
    )
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, help="progress (default: on a tty)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no summary")
    add_detector_options(p)
    p.set_defaults(func=cmd_dedup)


def _add_tune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``tune``: bands and rows for a threshold."""
    p = sub.add_parser(
        "tune",
        help="choose LSH bands and rows for a threshold and show the S-curve",
        description="Choose b and r (b*r <= K): the largest r, with b = floor(K/r), whose "
        "P(candidate) at the threshold reaches --recall-at-threshold.",
    )
    add_detector_options(
        p, ("threshold", "num_perm", "bands", "rows", "recall_at_threshold"), "detection"
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw the S-curve (needs the plot extra)")
    p.set_defaults(func=cmd_tune)


def _add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``generate``: a synthetic news stream."""
    p = sub.add_parser(
        "generate",
        help="write a synthetic wire-story stream (originals and re-runs) as JSON Lines",
        description="Write a deterministic synthetic news stream: original stories and "
        "publisher re-runs with mastheads, footers, updates, trims, re-wrapping, HTML "
        "entities and typos. Fields: id, title, text, publisher, story, kind.",
    )
    p.add_argument("-o", "--output", default="-", help="output file, or - (default)")
    p.add_argument("-n", "--documents", type=int, default=3000, help="records (3000)")
    p.add_argument("--rerun-rate", type=float, default=0.45, help="share of re-runs (0.45)")
    p.add_argument("--seed", type=int, default=7, help="random seed (7)")
    p.set_defaults(func=cmd_generate)


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run one command; errors print a message that says what to do, and set the code.

    SIGINT raises ``KeyboardInterrupt`` (exit code 130) from the start, however the process
    was started: a background job of a shell script inherits SIGINT *ignored*, and Python
    then installs no handler of its own, so without this a ``kill -INT`` (or Ctrl-C to the
    script's process group) would be lost and the command run to its end. The handler found
    is put back on return.
    """
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: signals are not ours to handle
        return _main(argv, out)
    try:
        return _main(argv, out)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def _main(argv: Sequence[str] | None, out: IO[str] | None) -> int:
    out = out or sys.stdout
    err = sys.stderr
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        from stream_dedup.malloc_tuning import keep_freed_memory

        keep_freed_memory()
        code: int = args.func(args, out, err)
    except KeyboardInterrupt:
        return _interrupted(args, err)
    except ConfigError as exc:
        print(f"error: {exc}", file=err)
        return 2
    except IndexStoreError as exc:
        print(f"error: {exc}", file=err)
        return 3
    except InputError as exc:
        print(f"error: {exc}", file=err)
        return 2
    except (TransactionError, RecordRefusedError) as exc:  # run stopped; its batch is replayed
        print(f"error: {exc}", file=err)
        return 1
    except BrokenPipeError:
        # The reader of our output went away (`... | head`): nothing to report. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (StreamDedupError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    except SystemError as exc:
        # Ctrl-C while a compiled (numba) kernel runs surfaces as a SystemError ("returned
        # a result with an exception set") whose cause is the KeyboardInterrupt.
        if not _caused_by_interrupt(exc):
            raise
        return _interrupted(args, err)
    return code


#: The exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130
#: The exit code of a command whose output pipe was closed (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by, or while handling, a ``KeyboardInterrupt``."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _interrupted(args: argparse.Namespace | None, err: IO[str]) -> int:
    """Say what an interrupted command left behind, in one line; the code is 130.

    ``dedup`` commits each batch in one atomic write after deciding it, so the index holds
    every batch committed before the interrupt and none of the one being decided; a rerun
    answers the ids already decided from the index (marked ``replayed``) and decides the
    rest. Without ``--index`` the index lived in memory and is gone.
    """
    if args is None or args.command != "dedup":
        message = "interrupted"
    elif args.index is None:
        message = (
            "interrupted; the index was in memory (no --index), so nothing was kept: "
            "rerun the command to start over, with --index DIR to be able to continue"
        )
    else:
        message = (
            f"interrupted; every batch committed before the interrupt is in the index at "
            f"{args.index}: rerun the same command to continue (documents already decided "
            'get their recorded verdicts back, marked "replayed")'
        )
    print(message, file=err)
    return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
