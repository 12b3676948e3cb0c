"""The ``stream-dedup`` command line: one module per command group, :mod:`.main` the
dispatcher."""

from stream_dedup.cli.app import main

__all__ = ["main"]
