"""The ``stream-dedup`` command line: :mod:`.app` builds the parser and dispatches to the
commands, the other modules hold command groups (:mod:`.ops`, :mod:`.kafka`, :mod:`.run`).

Each command imports what it runs when it runs, so ``--help`` and ``dedup`` load neither
Redis, the Kafka client nor the service's configuration (``tests/cli/test_startup.py``).
"""

from stream_dedup.cli.app import main

__all__ = ["main"]
