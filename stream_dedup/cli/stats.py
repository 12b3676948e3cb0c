"""``stream-dedup stats``: an index's parameters, counts and size, RocksDB or Redis."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import IO

#: ``stats --namespace``'s default: :data:`stream_dedup.index.redis_layout.DEFAULT_NAMESPACE`
#: (the tests hold one to the other), spelled here so that ``--help`` does not load the index.
DEFAULT_NAMESPACE = "stream-dedup"


def cmd_stats(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.index.opener import RedisSettings, open_index

    # An absent index is an IndexStoreError (exit code 3) that says how to create one.
    where = RedisSettings(args.redis, args.namespace) if args.redis is not None else args.index
    index = open_index(where, None)
    try:
        s = index.stats()
    finally:
        index.close()
    p = s.params
    rows = [
        ("index", s.location),
        ("format version", p.format_version),
        ("normalizer version", p.normalizer_version),
        ("shingles", f"{p.shingle_kind} {p.shingle_k}-grams (shingler v{p.shingler_version})"),
        ("signature", f"{p.signature_scheme}, K={p.num_perm}, seed={p.seed}"),
        ("bands x rows", f"{p.bands} x {p.rows}"),
        ("threshold", p.threshold),
        ("verification", p.verify),
        ("index policy", p.index_policy),
        ("documents", s.documents),
        ("indexed", s.indexed),
        ("duplicates", s.duplicates),
        ("empty", s.empty),
        (
            "size in Redis" if args.redis is not None else "size on disk",
            f"{s.size_bytes:,} bytes ({s.size_bytes / 2**20:.1f} MiB)",
        ),
        ("retention", s.retention.describe()),
        ("held", f"{s.held:,} documents in {s.epochs} epoch(s); {s.expired:,} expired"),
        ("stream clock", _when(s.clock) + _clock_note(s.clock, s.retention.window)),
        ("oldest held", _when(s.oldest_time)),
    ]
    for name, value in rows:
        print(f"{name:<20}{value}", file=out)
    return 0


def _clock_note(clock: int | None, window: int) -> str:
    """What a time window with no clock means, said beside the clock's dash."""
    if clock is not None or not window:
        return ""
    return (
        " (never set: no document decided had a time, so the retention window has expired "
        "nothing; offline, name the documents' time with dedup --time-field)"
    )


def _when(seconds: int | None) -> str:
    """A Unix time as ISO-8601 UTC, or a dash when unknown."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``stats``: an index's parameters, counts and size."""
    p = sub.add_parser(
        "stats",
        help="print an index's parameters, counts and size",
        description="Print an index's parameters, document counts and size on disk.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="RocksDB index directory")
    where.add_argument(
        "--redis",
        metavar="URL",
        help="a shared index on Redis: redis://[user:password@]host:port/db (rediss:// for "
        "TLS); the size is all the Redis servers' memory",
    )
    p.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help=f"with --redis (default {DEFAULT_NAMESPACE})"
    )
    p.set_defaults(func=cmd_stats)
