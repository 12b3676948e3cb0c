"""Commands around the service that talk to Kafka: ``produce`` and ``demo``.

``produce`` exits 0 when every line was delivered, 1 when the producer or the broker
refused a line (each reported with its line number), 2 when nothing could be sent (no
broker, a missing or invalid topic) or the broker went away midway.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import IO, Any

from stream_dedup.cli.run import add_set_option


def cmd_produce(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.input_files import open_input
    from stream_dedup.logs import setup_logging
    from stream_dedup.service.config_loading import load_config, parse_assignments
    from stream_dedup.tools.produce import produce_lines

    overrides = parse_assignments(args.assignments)
    if args.bootstrap_servers:
        overrides.setdefault("kafka", {})["bootstrap.servers"] = args.bootstrap_servers
    config = load_config(args.config, overrides=overrides)
    # An outage midway is logged (once, with what to check) while the lines wait for it.
    setup_logging(config.log.level, config.log.format)

    def show(n: int) -> None:
        err.write(f"\r{n:,} lines produced")
        err.flush()

    with ExitStack() as stack:
        source = open_input(args.input, stack)
        summary = produce_lines(
            source,
            args.topic,
            config.kafka,
            id_field=config.input.id_field,
            on_error=args.on_error,
            report=err,
            progress=show if err.isatty() else None,
        )
    if err.isatty():
        err.write("\n")
    print(
        f"{summary.delivered:,} lines delivered to {args.topic}, {summary.refused:,} refused",
        file=err,
    )
    if summary.stopped_at is not None:
        print(
            f"error: {summary.stopped_at.render()}. Sending stopped there: fix the line "
            "and send the lines from it on again, or rerun with --on-error skip",
            file=err,
        )
        return 1
    if summary.refused:
        print(
            f"error: {summary.refused:,} line(s) refused, not in {args.topic} (line numbers "
            "above): fix them and send those lines again",
            file=err,
        )
        return 1
    return 0


def cmd_demo(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.tools.demo import DemoOptions, run_demo

    opts = DemoOptions(
        documents=args.documents,
        seed=args.seed,
        http_port=args.http_port,
        index_dir=args.index,
        keep_running=args.keep_running,
        broker_port=args.broker_port,
        broker_only=args.broker_only,
    )
    return run_demo(opts, out)


def register(sub: Any) -> None:
    """Add ``produce`` and ``demo`` to the main parser's subcommands."""
    p = sub.add_parser(
        "produce",
        help="send JSON Lines to a Kafka topic, keyed by document id",
        description="Send each line of a JSON Lines file (or stdin) to a topic as one message, "
        "keyed by its id. Malformed lines are sent too: the service dead-letters them.",
    )
    p.add_argument("input", help="JSON Lines file, or - for standard input")
    p.add_argument("--topic", required=True, help="destination topic")
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (host:port,...)")
    p.add_argument("--config", metavar="FILE", help="service TOML file for [kafka] settings")
    p.add_argument(
        "--on-error",
        choices=["skip", "fail"],
        default="skip",
        help="a line the producer or broker refuses (too large, say): report it with its "
        "line number and send the others, or stop at it (skip); exit code 1 either way",
    )
    add_set_option(p)
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser(
        "demo",
        help="run the service end to end on an embedded broker and a sample stream",
        description="Start an embedded Kafka-protocol broker (needs the 'embedded' extra), "
        "stream a synthetic wire-story sample through the real service, print a summary, "
        "and stop everything.",
    )
    p.add_argument("-n", "--documents", type=int, default=3000, help="sample size (3000)")
    p.add_argument("--seed", type=int, default=7, help="sample seed (7)")
    p.add_argument(
        "--http-port", type=int, default=9400, help="metrics/health port (9400; 0 = any free)"
    )
    p.add_argument("--index", help="index directory (default: a temporary one)")
    p.add_argument(
        "--keep-running", action="store_true", help="leave the service up to explore /metrics"
    )
    p.add_argument(
        "--broker-port", type=int, default=0, help="the embedded broker's port (0 = any free)"
    )
    p.add_argument(
        "--broker-only",
        action="store_true",
        help="start only the embedded broker with the demo's topics, until Ctrl-C, and print "
        "how to point `run` and `produce` at it",
    )
    p.set_defaults(func=cmd_demo)
