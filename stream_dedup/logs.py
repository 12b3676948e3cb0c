"""Structured logs: one line per event, JSON or key=value, on standard error.

Call sites log a short message saying what happened and pass fields with
``extra={"fields": {...}}``; the formatter adds time, level and logger. Messages about a
problem also say what to do (``action=...``), because the reader is an operator.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Hashable
from typing import Any

_RESERVED = {"ts", "level", "logger", "msg"}


def fields(**kw: object) -> dict[str, dict[str, object]]:
    """``extra=fields(key=value, ...)``: the structured fields of one log call."""
    return {"fields": kw}


class LogThrottle:
    """Lets the first line of a kind through, then one per ``window_s``, counting the rest.

    :meth:`admit` answers None for a line to drop, else how many of its kind were dropped
    since the last one let through (to log with it). Kinds are whatever the caller keys
    lines by; a flood of distinct kinds (over ``max_kinds``) starts the memory afresh.
    """

    def __init__(self, window_s: float = 60.0, max_kinds: int = 1024) -> None:
        self._window_s = window_s
        self._max_kinds = max_kinds
        self._seen: dict[Hashable, list[float]] = {}  # kind -> [let through at, dropped]
        self._lock = threading.Lock()

    def admit(self, kind: Hashable) -> int | None:
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(kind)
            if entry is None:
                if len(self._seen) >= self._max_kinds:
                    self._seen.clear()
                self._seen[kind] = [now, 0]
                return 0
            if now - entry[0] < self._window_s:
                entry[1] += 1
                return None
            dropped = int(entry[1])
            entry[0], entry[1] = now, 0
            return dropped


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ts": round(record.created, 3),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    extra = getattr(record, "fields", None)
    if isinstance(extra, dict):
        for key, value in extra.items():
            body[key if key not in _RESERVED else f"field_{key}"] = value
    if record.exc_info:
        body["exception"] = logging.Formatter().formatException(record.exc_info)
    return body


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """``key=value`` pairs, values quoted when they hold spaces or quotes."""

    def format(self, record: logging.LogRecord) -> str:
        parts = []
        for key, value in _fields(record).items():
            text = str(value)
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text, ensure_ascii=False)
            parts.append(f"{key}={text}")
        return " ".join(parts)


def setup_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Route the package's logs (and librdkafka's, via our loggers) to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger("stream_dedup")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
