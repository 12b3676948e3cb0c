"""The service's checks on its HTTP port: ``POST /check`` (one document) and ``POST
/check/batch`` (a JSON array of them), answered from the committed index without adding
anything (:mod:`stream_dedup.dedup.check`).

A document is a JSON object with the fields the service reads from its input (``input.
id_field`` and ``input.content_fields``: ``id``, ``title``, ``text`` by default); ``?k=``
asks for up to that many matches (default 5, at most ``http.check_max_k``). The answer is
``{"id": ..., "matches": [...]}`` for one document and ``{"answers": [...]}`` for a batch,
in order. A bad request is a 4xx whose JSON body names the ``error`` and the ``detail``:
400 for bad JSON, a document without an id or text (the input's decode reasons), a bad
``k`` or too many documents; 413 for a body over ``http.check_max_bytes`` (not read); 411
without a Content-Length; 503 before the index is open (the service is starting) or once
it is closing; 500 when the index cannot be read.

Where: by default in the check process (:mod:`stream_dedup.service.check_process`), on
its own port, from a follower of the committed index
(:class:`~stream_dedup.index.follower.FollowerIndex`); with ``http.check_process =
false``, on the service's port, from the index the loop writes. The same endpoint serves
both; only the index object and the process differ.

Thread safety (in the service's process): requests are answered on the HTTP server's
threads while the loop thread decides and commits batches on the same index object. The
loop is the only writer; a check does its index reads inside
:meth:`~stream_dedup.index.reads.IndexReads.consistent`, a lock that checks share and that
a commit
(:meth:`~stream_dedup.index.store.DedupIndex.apply`) takes alone only to swap the index's
in-memory state (counters, epochs, key filters: microseconds) and to drop the epochs
retention let go, not for its write, which is atomic by itself. So a check never reads a
dropped epoch or a half-changed filter, reads only committed data (never the batch being
decided), never waits for another check, and a commit waits at most for the checks'
reads under way (batched reads of their band buckets and candidate records). The scoring
runs outside the lock.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from stream_dedup.core.bands import BandPlan
from stream_dedup.core.config import DedupConfig
from stream_dedup.decode import DocumentFormat, document_from_object
from stream_dedup.dedup.check import HeldReader, answer, check_texts
from stream_dedup.errors import DecodeError, IndexUnreachableError, StreamDedupError
from stream_dedup.index.store import DedupIndex
from stream_dedup.logs import fields
from stream_dedup.models import CheckMatch, Document
from stream_dedup.service.check_metrics import CheckMetrics
from stream_dedup.service.config import HttpConfig

log = logging.getLogger("stream_dedup.http")

#: The paths served here (POST only).
CHECK_PATHS = ("/check", "/check/batch")
#: Matches per document unless ``?k=`` asks for another number (capped by check_max_k).
DEFAULT_K = 5

#: A reply: the HTTP status and its JSON body.
Reply = tuple[int, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A request answered with a 4xx or 5xx: its status, outcome label and reason."""

    status: int
    outcome: str
    error: str
    detail: str


def _bad(error: str, detail: str) -> _Refusal:
    return _Refusal(400, "bad_request", error, detail)


_UNAVAILABLE = _Refusal(
    503, "unavailable", "unavailable",
    "the index is not open or out of reach: the service is starting or stopping, or its "
    "shared index is unreachable (retry shortly)",
)  # fmt: skip


class CheckEndpoint:
    """Answers check requests from ``index`` (see the module docstring).

    ``index``: the index, or what answers a check's reads (the check process's readers).
    ``is_open`` says whether the index may be read now: from the end of the service's
    warm-up (its key filter is built) until it starts to close.
    """

    def __init__(
        self,
        index: DedupIndex | HeldReader,
        dedup: tuple[DedupConfig, BandPlan],
        fmt: DocumentFormat,
        limits: HttpConfig,
        metrics: CheckMetrics,
        is_open: Callable[[], bool],
    ) -> None:
        self._index = index
        self._config, self._plan = dedup
        self._fmt = fmt
        self._limits = limits
        self._metrics = metrics
        self._is_open = is_open

    def handle(
        self, path: str, query: str, length: int | None, read: Callable[[int], bytes]
    ) -> Reply:
        """Answer a POST to ``path`` (one of :data:`CHECK_PATHS`) with query string
        ``query`` and a body of ``length`` bytes (``None``: no Content-Length), read with
        ``read`` only when within the limit."""
        started = time.perf_counter()
        got = self._answer(path, query, length, read)
        if isinstance(got, _Refusal):
            reply: Reply = (got.status, {"error": got.error, "detail": got.detail})
            outcome = got.outcome
        else:
            reply, outcome = (200, got), "ok"
        self._metrics.requests.labels(outcome).inc()
        self._metrics.duration.observe(time.perf_counter() - started)
        return reply

    def _answer(
        self, path: str, query: str, length: int | None, read: Callable[[int], bytes]
    ) -> dict[str, Any] | _Refusal:
        """The answer's body, or why the request is refused."""
        if length is None:
            return _Refusal(411, "bad_request", "length_required", "send a Content-Length")
        most = self._limits.check_max_bytes
        if length > most:
            return _Refusal(
                413, "too_large", "body_too_large",
                f"the body is {length} bytes, more than http.check_max_bytes ({most})",
            )  # fmt: skip
        k = self._k(query)
        if isinstance(k, _Refusal):
            return k
        try:
            body = json.loads(read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            return _bad("invalid_json", f"the body is not JSON: {exc}")
        docs = self._documents(body, path == "/check/batch")
        if isinstance(docs, _Refusal):
            return docs
        found = self._check(docs, k)
        if isinstance(found, _Refusal):
            return found
        answers = [answer(d.id, m) for d, m in zip(docs, found, strict=True)]
        return answers[0] if path == "/check" else {"answers": answers}

    def _k(self, query: str) -> int | _Refusal:
        """``?k=``: a whole number from 1 to ``http.check_max_k``."""
        most = self._limits.check_max_k
        values = parse_qs(query, keep_blank_values=True).get("k")
        if values is None:
            return min(DEFAULT_K, most)
        raw = values[-1]
        if not raw.isdigit() or not 1 <= int(raw) <= most:
            return _bad(
                "bad_k",
                f"k must be a whole number from 1 to {most} (http.check_max_k), got {raw!r}",
            )
        return int(raw)

    def _documents(self, body: Any, batch: bool) -> list[Document] | _Refusal:
        """The documents of a request: one object, or a batch's array of them."""
        if not batch:
            items = [body]
        elif not isinstance(body, list):
            return _bad("not_a_list", "/check/batch takes a JSON array of documents")
        elif len(body) > (most := self._limits.check_max_documents):
            return _bad(
                "too_many_documents",
                f"{len(body)} documents, more than http.check_max_documents ({most})",
            )
        else:
            items = body
        docs = []
        for i, obj in enumerate(items):
            try:
                docs.append(document_from_object(obj, self._fmt))
            except DecodeError as exc:
                where = f"document {i}: " if batch else ""
                return _bad(exc.reason, where + exc.detail)
        return docs

    def _check(self, docs: list[Document], k: int) -> list[list[CheckMatch]] | _Refusal:
        """The checks of ``docs``, or why the index cannot answer now."""
        if not self._is_open():
            return _UNAVAILABLE
        try:
            return check_texts(self._index, self._config, self._plan, [d.content for d in docs], k)
        except IndexUnreachableError as exc:  # an outage: said once by the follower's log
            return _Refusal(503, "unavailable", "unavailable", f"{exc}; retry later")
        except (StreamDedupError, OSError, RuntimeError) as exc:
            if not self._is_open():  # closed while the check waited for the index
                return _UNAVAILABLE
            log.exception(
                "a check could not read the index",
                extra=fields(action="see the error; the loop goes on"),
            )
            return _Refusal(500, "failed", "failed", f"{type(exc).__name__}: {exc}")
