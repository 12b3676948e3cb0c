"""Operations commands: ``snapshot`` and ``restore`` of an index, ``config check``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stream_dedup.service.config import ServiceConfig


def cmd_snapshot(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.index.snapshot import snapshot

    def show(copied: int) -> None:
        err.write(f"\r{copied:,} keys copied")
        err.flush()

    info = snapshot(args.index, args.to, progress=show if err.isatty() else None)
    print(
        f"snapshot of {args.index} written to {info.path}: {info.keys:,} keys ({info.method})",
        file=out,
    )
    return 0


def cmd_restore(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.index.snapshot import restore

    info = restore(args.backup, args.index, force=args.force)
    print(f"restored {info.keys:,} keys from {args.backup} into {info.path}", file=out)
    if info.replaced is not None:
        print(
            f"the index that was there is kept at {info.replaced} (delete it once the "
            "restored index is known to be good)",
            file=out,
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operations subcommands to the main parser."""
    register_config(sub)
    p = sub.add_parser(
        "snapshot",
        help="write a consistent backup of an index (also while the service runs)",
        description="Write a consistent copy of an index to a new directory. A stopped index "
        "is checkpointed (hard links, instant); a running one is copied through a read-only "
        "view, which holds the state after some complete batch, offsets included.",
    )
    p.add_argument("--index", required=True, help="index directory")
    p.add_argument("--to", required=True, metavar="BACKUP", help="new, empty backup directory")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser(
        "restore",
        help="put a snapshot back as an index (stop the service first)",
        description="Copy a snapshot into place as the index directory. The service must be "
        "stopped; it resumes from the input offsets stored in the snapshot.",
    )
    p.add_argument("backup", help="snapshot directory written by `stream-dedup snapshot`")
    p.add_argument("--index", required=True, help="index directory to restore into")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing index; it is moved aside, never deleted, to DIR.replaced "
        "(or DIR.replaced.1, .2, ... if taken)",
    )
    p.set_defaults(func=cmd_restore)


_SECRET_WORDS = ("password", "secret", "token", "credential", "key.pem", "sasl.jaas")


def _masked(key: str, value: object) -> object:
    """Values of secret-looking keys (passwords, secrets, tokens, private keys) as ``***``,
    and the password inside a URL."""
    if isinstance(value, str) and "://" in value:
        from stream_dedup.index.redis_layout import redacted

        return redacted(value)
    return "***" if any(w in key.lower() for w in _SECRET_WORDS) and value else value


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def render_effective(config: ServiceConfig) -> str:
    """The effective configuration as TOML, secrets masked (what ``config check`` prints)."""
    lines: list[str] = []

    def table(title: str, values: dict[str, object]) -> None:
        lines.append(f"[{title}]")
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        for key, value in values.items():
            if key not in nested:
                name = f'"{key}"' if "." in key else key
                lines.append(f"{name} = {_toml_value(_masked(key, value))}")
        lines.append("")
        for key, value in nested.items():
            table(f"{title}.{key}", value)

    for f in fields(config):
        section = getattr(config, f.name)
        table(f.name, dict(section) if f.name == "kafka" else asdict(section))
    return "\n".join(lines)


def cmd_config_check(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.service.config_loading import load_config

    config = load_config(args.file)
    print(
        f"# {args.file}: valid (file < STREAM_DEDUP_* environment; [kafka] accepted by "
        "librdkafka); effective settings:",
        file=out,
    )
    print(render_effective(config), file=out)
    return 0


def register_config(sub: Any) -> None:
    """Add ``config check``."""
    p = sub.add_parser(
        "config",
        help="validate a configuration file and show the effective settings",
        description="Configuration tools.",
    )
    config_sub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    c = config_sub.add_parser(
        "check",
        help="validate FILE and print the effective configuration, secrets masked",
        description="Validate a TOML configuration file (unknown keys, wrong types and "
        "values out of range are errors naming the key; the [kafka] settings are checked by "
        "librdkafka itself, without connecting), apply STREAM_DEDUP_<SECTION>__<KEY> "
        "environment overrides, and print the effective configuration with passwords and "
        "secrets masked.",
    )
    c.add_argument("file", help="TOML configuration file")
    c.set_defaults(func=cmd_config_check)
