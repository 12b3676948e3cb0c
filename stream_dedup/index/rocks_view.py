"""A read-only view of a RocksDB index that writes nothing into the index's directory.

rocksdict writes its settings file (``rocksdict-config.json``) beside a database whenever
it opens one, even read-only: in place, a directory mounted read-only or owned by the
service's user could not be read at all, and a running service's directory would be
written by a reader. The view is a temporary directory of links to the database's files
(the settings file copied): RocksDB's read-only mode reads them through the links and
writes only its own log, into the view.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

#: Written by whoever opens the database; copied into the view, never linked.
_SETTINGS = "rocksdict-config.json"


def linked_view(path: str) -> str:
    """A new temporary directory of links to the database at ``path`` (the caller removes
    it with :func:`remove_view` once the database is closed)."""
    view = tempfile.mkdtemp(prefix="stream-dedup-view-")
    for entry in Path(path).iterdir():
        if entry.name == _SETTINGS:
            shutil.copyfile(entry, Path(view) / entry.name)
        elif entry.name != "LOCK" and not entry.name.startswith("LOG"):
            (Path(view) / entry.name).symlink_to(entry.resolve())
    return view


def remove_view(view: str) -> None:
    """Remove a view made by :func:`linked_view` (the links only, never their targets)."""
    shutil.rmtree(view, ignore_errors=True)
