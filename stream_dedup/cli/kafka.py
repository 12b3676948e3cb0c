"""Commands around the service that talk to Kafka: ``produce`` and ``demo``."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import IO, Any

from stream_dedup.cli.run import add_set_option


def cmd_produce(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.logs import setup_logging
    from stream_dedup.offline import open_input
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
        sent = produce_lines(
            source,
            args.topic,
            config.kafka,
            id_field=config.input.id_field,
            progress=show if err.isatty() else None,
        )
    print(f"{sent:,} lines delivered to {args.topic}", file=err)
    return 0


def cmd_demo(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.tools.demo import DemoOptions, run_demo

    opts = DemoOptions(
        documents=args.documents,
        seed=args.seed,
        http_port=args.http_port,
        index_dir=args.index,
        keep_running=args.keep_running,
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
    p.set_defaults(func=cmd_demo)
