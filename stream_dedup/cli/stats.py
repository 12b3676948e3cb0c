"""``stream-dedup stats``: an index's parameters, counts and size, RocksDB or Redis."""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from stream_dedup.index.store import DedupIndex

#: ``stats --namespace``'s default: :data:`stream_dedup.index.redis_layout.DEFAULT_NAMESPACE`
#: (the tests hold one to the other), spelled here so that ``--help`` does not load the index.
DEFAULT_NAMESPACE = "stream-dedup"

#: The service's variable for the shared index's password, read here too, so that an
#: operator's environment serves both and the password stays out of the command line.
PASSWORD_VARIABLE = "STREAM_DEDUP_INDEX__REDIS__PASSWORD"


#: What exact verification stores per document, by index format (see index/records.py).
_PAYLOADS = {
    2: "verification sets",
    3: "verification sets",
    4: "compressed text",
    5: "compressed text",
    6: "compressed text",
}


def open_for_reading(args: argparse.Namespace) -> DedupIndex:
    """The index ``--index`` or ``--redis``/``--namespace``/``--tls-ca-file`` name, opened
    to read (``stats``, ``check``).

    An absent index is an IndexStoreError (exit code 3) that says how to create one. A
    RocksDB index is read as a frozen view without its lock: the service may be writing
    it, and the directory may be read-only.
    """
    from stream_dedup.index.opener import RedisSettings, open_index

    where = (
        RedisSettings(
            args.redis,
            args.namespace,
            password=os.environ.get(PASSWORD_VARIABLE) or None,
            tls_ca_file=args.tls_ca_file,
        )
        if args.redis is not None
        else args.index
    )
    index = open_index(where, None, read_only=True)
    return index


def cmd_stats(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from stream_dedup.core.payload_dictionary import dictionary_id

    index = open_for_reading(args)
    try:
        s = index.stats()
        dictionary = index.payload_dictionary()
    finally:
        index.close()
    p = s.params
    rows = [
        ("index", s.location),
        ("format version", f"{p.format_version} ({_PAYLOADS.get(p.format_version, '?')})"),
        ("normalizer version", p.normalizer_version),
        ("shingles", f"{p.shingle_kind} {p.shingle_k}-grams (shingler v{p.shingler_version})"),
        ("signature", f"{p.signature_scheme}, K={p.num_perm}, seed={p.seed}"),
        ("bands x rows", f"{p.bands} x {p.rows}"),
        ("threshold", p.threshold),
        ("verification", p.verify),
        (
            "payload dictionary",
            "none (yet)"
            if dictionary is None
            else f"{dictionary_id(dictionary):#010x}, {len(dictionary):,} bytes",
        ),
        ("index policy", p.index_policy),
        ("documents", s.documents),
        ("indexed", s.indexed),
        ("duplicates", s.duplicates),
        ("empty", s.empty),
        (
            "size in Redis" if args.redis is not None else "size on disk",
            f"{s.size_bytes:,} bytes ({s.size_bytes / 2**20:.1f} MiB)",
        ),
        ("bytes/document", f"{s.size_bytes / s.held:,.0f} per held document" if s.held else "-"),
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
        description="Print an index's parameters, document counts and size on disk. A "
        "RocksDB index is read without its lock, as it was at that moment: a running "
        "service may hold it, and the directory may be read-only.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="RocksDB index directory")
    where.add_argument(
        "--redis",
        metavar="URL",
        help="a shared index on Redis: redis://host:port/db (rediss:// for TLS); the "
        f"password, if any, from {PASSWORD_VARIABLE} (as the service reads it) or the URL; "
        "the size is all the Redis servers' memory",
    )
    p.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help=f"with --redis (default {DEFAULT_NAMESPACE})"
    )
    p.add_argument(
        "--tls-ca-file",
        metavar="PATH",
        help="with a rediss:// URL: the CA certificate to trust (default the system's)",
    )
    p.set_defaults(func=cmd_stats)
