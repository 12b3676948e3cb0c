"""``python -m stream_dedup.cli``: the same as the ``stream-dedup`` command."""

import sys

from stream_dedup.cli.app import main

sys.exit(main())
