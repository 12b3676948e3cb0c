"""The ``stream-dedup run`` subcommand: configuration layers -> :class:`Service`.

Kept out of :mod:`stream_dedup.cli.app` so the command line module stays a thin dispatcher.
Exit codes follow the CLI's: 0 clean stop, 1 stopped with an unconfirmed last batch,
2 configuration error, 3 index error (locked by another instance, other parameters, a
read or write that failed).
"""

from __future__ import annotations

import argparse
from typing import IO, Any

from stream_dedup.errors import IndexLockedError


def add_set_option(p: argparse.ArgumentParser) -> None:
    """The repeatable ``--set section.key=value`` override shared by commands that read config."""
    p.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set batch.max_wait_ms=50 or "
        "--set kafka.security.protocol=SASL_SSL (repeatable)",
    )


def add_run_command(sub: Any) -> None:
    """Register ``run`` on the CLI's subparsers."""
    p = sub.add_parser(
        "run",
        help="run the Kafka service: consume documents, emit unique/duplicate events",
        description="Consume documents from Kafka, decide each against the index, produce one "
        "event per document, and checkpoint (events confirmed, then index and offsets in one "
        "write, then Kafka offsets). Settings: --config FILE < STREAM_DEDUP_<SECTION>__<KEY> "
        "environment variables < flags. See config/stream-dedup.toml for every setting.",
    )
    p.add_argument("--config", metavar="FILE", help="TOML configuration file")
    add_set_option(p)
    p.add_argument("--bootstrap-servers", help="shortcut for kafka.bootstrap.servers")
    p.add_argument("--topics", help="shortcut for input.topics (comma-separated)")
    p.add_argument("--index", dest="index_path", help="shortcut for index.path")
    p.add_argument("--http-port", type=int, help="shortcut for http.port")
    p.add_argument("--log-level", help="shortcut for log.level")
    p.set_defaults(func=cmd_run)


def _flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from stream_dedup.service.config_loading import parse_assignments

    out = parse_assignments(args.assignments)
    shortcuts = [
        ("kafka", "bootstrap.servers", args.bootstrap_servers),
        ("input", "topics", args.topics),
        ("index", "path", args.index_path),
        ("http", "port", args.http_port),
        ("log", "level", args.log_level),
    ]
    for section, key, value in shortcuts:
        if value is not None:
            out.setdefault(section, {})[key] = value
    return out


def cmd_run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Load the configuration, start the service, run until SIGTERM/SIGINT.

    The signal handlers come first: a stop asked for while the settings are read, the
    index opened or the key filter built is honoured as soon as it can be (see
    :mod:`stream_dedup.service.stopping`), not lost and not a traceback.
    """
    import logging

    from stream_dedup.service.stopping import StopRequest

    stop = StopRequest()
    stop.install()

    from stream_dedup.logs import setup_logging
    from stream_dedup.service.config_loading import load_config
    from stream_dedup.service.loop import Service

    config = load_config(args.config, overrides=_flag_overrides(args))
    setup_logging(config.log.level, config.log.format)
    if stop.is_set():
        return 0
    try:
        service = Service(config, stop=stop)
    except IndexLockedError as exc:
        logging.getLogger("stream_dedup.service").error(
            "another instance holds the index; refusing to start",
            extra={"fields": {"index": config.index.path, "error": str(exc)}},
        )
        raise
    return service.run()
