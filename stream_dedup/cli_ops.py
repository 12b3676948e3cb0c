"""Operations commands: ``snapshot`` and ``restore`` of an index."""

from __future__ import annotations

import argparse
from typing import IO

from stream_dedup.index.snapshot import restore, snapshot


def cmd_snapshot(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
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
    info = restore(args.backup, args.index, force=args.force)
    print(f"restored {info.keys:,} keys from {args.backup} into {info.path}", file=out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operations subcommands to the main parser."""
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
        "--force", action="store_true", help="replace an existing index (kept as DIR.replaced)"
    )
    p.set_defaults(func=cmd_restore)
