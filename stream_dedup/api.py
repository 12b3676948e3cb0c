"""The Python API: a near-duplicate detector over an in-memory or on-disk index.

:class:`Detector` is the library face of the same detector the ``stream-dedup`` command and
the Kafka service run: :meth:`~Detector.add` decides a document against everything added
before it and indexes it, :meth:`~Detector.query` asks the same question without indexing
anything, and :meth:`~Detector.check` lists the indexed documents most similar to a text,
with their scores, also without indexing it. With a directory the index is a RocksDB
database that persists: opening the directory again continues from it, with the
parameters it was built with.

>>> from stream_dedup import Detector
>>> ad = ("Bright two-room flat near Termini station, furnished, balcony, "
...       "available from September, 650 euro per month including bills")
>>> detector = Detector(threshold=0.8)
>>> detector.add("ad-1", ad).verdict
<VerdictKind.UNIQUE: 'unique'>
>>> verdict = detector.add("ad-2", ad.replace("650", "680"))
>>> verdict.duplicate_of, verdict.similarity, verdict.cluster_id
('ad-1', 0.919355, 'ad-1')
>>> [v.verdict.value for v in detector.add_many([
...     ("ad-3", "Room for a student in Trastevere, shared kitchen, 400 euro"),
...     ("ad-4", "room for a student in trastevere,  shared kitchen, 400 euro!"),
... ])]
['unique', 'duplicate']
>>> match = detector.query(ad.upper())  # case and whitespace are normalised away
>>> match.is_duplicate, match.duplicate_of, match.similarity
(True, 'ad-1', 1.0)
>>> detector.query("Garage to let in Ostia").is_duplicate
False
>>> [(m.id, m.similarity, m.containment, m.relation.value)
...  for m in detector.check(ad, k=3)]  # ad-3 and ad-4 share no band with it
[('ad-1', 1.0, 1.0, 'near-duplicate'), ('ad-2', 0.919355, 0.957983, 'near-duplicate')]
>>> detector.check("Garage to let in Ostia")
[]
>>> detector.stats
DetectorStats(documents=4, indexed=4, duplicates=2, empty=0)
>>> detector.close()

The rules are those of :mod:`stream_dedup.dedup`: similarity is the Jaccard similarity of
the normalised texts' shingle sets, a document is a duplicate of the most similar earlier
document at or above the threshold (its ``cluster_id`` is that cluster's first document),
identical normalised texts match with similarity 1.0, and a text that normalises to nothing
is ``unique`` with ``empty=True`` and never indexed. An id decided before gets its stored
verdict back (``replayed=True``), so adding the same documents twice is harmless; an id
added again with another text is decided again as its next revision
(``Verdict.revision``; ``revisions="replay"`` keeps the old verdict: see
``docs/revisions.md``).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from stream_dedup.api_inputs import batches, document, kind, refuse_one_text, text_of
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import check_k, check_texts
from stream_dedup.dedup.queries import query_verdicts
from stream_dedup.errors import ConfigError, DecodeError, IndexStoreError, RetentionWarning
from stream_dedup.index.opener import open_or_create
from stream_dedup.index.retention import NO_CLOCK, RetentionChange, format_duration
from stream_dedup.index.store import DedupIndex
from stream_dedup.models import CheckMatch, Document, Verdict

#: Documents decided and committed together by :meth:`Detector.add_many`, as the offline
#: command does: large enough that the per-batch index reads and write are cheap per
#: document, small enough that a batch's working memory stays a few megabytes.
DEFAULT_BATCH_SIZE = 1000
#: Matches a check lists unless asked for another number.
DEFAULT_CHECK_K = 5


@dataclass(frozen=True, slots=True)
class QueryResult:
    """What :meth:`Detector.query` found for one text.

    ``is_duplicate``: an indexed document is at least ``threshold`` similar; then
    ``duplicate_of`` is the most similar one (the earliest on a tie), ``similarity`` its
    Jaccard similarity and ``cluster_id`` the first document of its cluster; all three are
    ``None`` otherwise. ``empty``: the text normalises to nothing, so it matches nothing.
    """

    is_duplicate: bool
    duplicate_of: str | None
    similarity: float | None
    cluster_id: str | None
    empty: bool = False


@dataclass(frozen=True, slots=True)
class DetectorStats:
    """The index's counters: ``documents`` decided (replays not counted again), of which
    ``indexed`` entered the index, ``duplicates`` were near-duplicates and ``empty`` had no
    text left after normalisation."""

    documents: int
    indexed: int
    duplicates: int
    empty: int


class Detector:
    """Near-duplicate detection over one index, in memory or in a RocksDB directory.

    ``path=None`` keeps the index in memory (gone on :meth:`close`); a directory holds a
    persistent index, created if absent. Detector parameters are the fields of
    :class:`~stream_dedup.core.config.DedupConfig` (``threshold``, ``num_perm``, ...) as
    keyword arguments, or a whole ``config``; a parameter left out takes the index's stored
    value when the directory holds an index, else the default. The parameters that shape
    the stored signatures and band keys are stored with the index, so an explicit value
    that differs from the stored one raises
    :class:`~stream_dedup.errors.IndexMismatchError` (naming each difference) instead of
    silently mixing incompatible data.

    ``retention`` (a duration such as ``"30d"``, or seconds) and ``max_documents`` bound
    what the index holds (see :mod:`stream_dedup.index.retention`); left out, an existing
    index keeps the retention it stores. The window is measured on the documents' time:
    give :meth:`add_many` :class:`~stream_dedup.models.Document` objects with ``time``.
    A window in force while every document of a batch comes without a time (``add``, or
    ``(id, text)`` pairs) issues a :class:`~stream_dedup.errors.RetentionWarning`, once
    per detector; a zero window (``0``, ``"0d"``) is a ``ConfigError`` (``"none"`` is no
    window).

    ``batch_size`` is how many documents :meth:`add_many` decides and commits at a time;
    ``sync=True`` fsyncs every commit of an on-disk index (surviving a machine crash, not
    only a killed process, at the cost of one fsync per commit).

    A detector is not thread-safe, and a directory has one writer at a time (another open
    of it raises :class:`~stream_dedup.errors.IndexLockedError`). Use it as a context
    manager, or call :meth:`close`, so that an on-disk index is closed cleanly (its key
    filter is saved, making the next open fast).

    Raises :class:`~stream_dedup.errors.ConfigError` for an unknown or invalid parameter and
    :class:`~stream_dedup.errors.IndexStoreError` (or a subclass) when the index cannot be
    opened as asked.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        config: DedupConfig | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        sync: bool = False,
        retention: str | int | None = None,
        max_documents: int | None = None,
        **params: Any,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError("batch_size", f"must be a positive integer, got {batch_size!r}")
        if config is not None and params:
            raise ConfigError(
                "config", f"give a config or parameters ({', '.join(sorted(params))}), not both"
            )
        _check_names(params)
        self._batch_size = batch_size
        change = RetentionChange.of(retention, max_documents)
        self._index, self._config = _open(path, config, params, sync=sync, retention=change)
        self._dedup = Deduplicator(self._index, self._config)
        self._closed = False
        self._warned_no_time = False

    # -- what it is -------------------------------------------------------------------

    @property
    def config(self) -> DedupConfig:
        """The detector's parameters (for a reopened index: the ones it was built with)."""
        return self._config

    @property
    def index(self) -> DedupIndex:
        """The underlying index (its parameters, counters, location)."""
        return self._open_index()

    @property
    def location(self) -> str:
        """The index directory, or a description of the in-memory index."""
        return self._index.location

    @property
    def stats(self) -> DetectorStats:
        """The index's counters, as committed."""
        index = self._open_index()
        return DetectorStats(
            documents=index.counter("documents"),
            indexed=index.counter("indexed"),
            duplicates=index.counter("duplicates"),
            empty=index.counter("empty"),
        )

    def __len__(self) -> int:
        """Documents decided so far (each id once per text: revisions count)."""
        return self._open_index().counter("documents")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} documents"
        return f"<Detector {self._index.location} threshold={self._config.threshold} {state}>"

    # -- adding -----------------------------------------------------------------------

    def add(self, id: str, text: str) -> Verdict:
        """Decide one document against everything added before, then index it.

        Returns its :class:`~stream_dedup.models.Verdict`; an ``id`` decided before with the
        same normalised text returns the stored verdict (``replayed=True``) and changes
        nothing; with another text it is decided as the id's next revision.
        """
        return self._add_many([(id, text)])[0]

    def add_many(self, documents: Iterable[Document | tuple[str, str]]) -> list[Verdict]:
        """Decide documents in order, each against everything before it, and index them.

        ``documents`` are :class:`~stream_dedup.models.Document` objects or ``(id, text)``
        pairs, any iterable (a generator is read ``batch_size`` at a time). Each batch is
        decided (later documents see earlier ones of the same batch) and committed in one
        atomic write, so a call of up to ``batch_size`` documents is all or nothing; for a
        larger one an error leaves the batches before it committed, and adding the same
        documents again gives their stored verdicts back. The verdicts are the ones the
        offline command gives for the same documents in the same order.
        """
        return self._add_many(documents)

    def _add_many(self, documents: Iterable[Document | tuple[str, str]]) -> list[Verdict]:
        """:meth:`add_many`, called by it and by :meth:`add` (so that a warning names the
        caller's line: two frames up)."""
        self._open_index()
        refuse_one_text(documents, "add_many", "(id, text) pairs", "add(id, text)")
        verdicts: list[Verdict] = []
        for batch in batches(map(document, documents), self._batch_size):
            result = self._dedup.process(batch)
            verdicts.extend(result.verdicts)
            if result.stats.window_without_time and not self._warned_no_time:
                self._warned_no_time = True
                warnings.warn(_no_time(self._index), RetentionWarning, stacklevel=3)
        return verdicts

    # -- asking -----------------------------------------------------------------------

    def query(self, text: str) -> QueryResult:
        """Is ``text`` a near-duplicate of an indexed document? Nothing is written.

        The answer is the verdict :meth:`add` would give ``text`` under a new id now, and
        the index, its counters included, is left exactly as it was.
        """
        return self.query_many([text])[0]

    def query_many(self, texts: Iterable[str]) -> list[QueryResult]:
        """:meth:`query` for each text, each against the index only (not each other)."""
        self._open_index()
        refuse_one_text(texts, "query_many", "texts", "query(text)")
        batch = list(texts)
        for text in batch:
            if not isinstance(text, str):
                raise DecodeError("invalid_content", f"a text must be a str, got {kind(text)}")
        results: list[QueryResult] = []
        for start in range(0, len(batch), self._batch_size):
            chunk = batch[start : start + self._batch_size]
            results.extend(map(_result, query_verdicts(self._dedup, chunk)))
        return results

    def check(self, text: str | Document, k: int = DEFAULT_CHECK_K) -> list[CheckMatch]:
        """The ``k`` indexed documents most similar to ``text``, most similar first; nothing
        is written.

        Unlike :meth:`query`, which gives the one verdict, a check lists every candidate
        the band buckets give (up to ``max(k, max_candidates)`` are verified), each with
        its exact Jaccard ``similarity``, the ``containment`` of ``text`` in it (the share
        of the text's shingles it holds) and the reverse, and a ``relation``:
        ``near-duplicate`` at or above the threshold, else ``similar`` (see
        :class:`~stream_dedup.models.CheckMatch`). The first near-duplicate is the document
        :meth:`query` names, with the same similarity. ``text`` may be a
        :class:`~stream_dedup.models.Document` (its content is checked). An id added with
        several texts (revisions) is listed once, by its revision most similar to ``text``.
        An empty list: nothing indexed shares a band with it.
        """
        return self.check_many([text], k)[0]

    def check_many(
        self, texts: Iterable[str | Document], k: int = DEFAULT_CHECK_K
    ) -> list[list[CheckMatch]]:
        """:meth:`check` for each text, each against the index only (not each other)."""
        self._open_index()
        refuse_one_text(texts, "check_many", "texts", "check(text)")
        check_k(k)
        batch = [text_of(t) for t in texts]
        plan = self._dedup.plan
        answers: list[list[CheckMatch]] = []
        for start in range(0, len(batch), self._batch_size):
            chunk = batch[start : start + self._batch_size]
            answers.extend(check_texts(self._index, self._config, plan, chunk, k))
        return answers

    # -- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the index (an on-disk one saves its key filter); calling again is a no-op."""
        if not self._closed:
            self._closed = True
            self._index.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open_index(self) -> DedupIndex:
        if self._closed:
            raise IndexStoreError(f"the detector on {self._index.location} is closed")
        return self._index


def _no_time(index: DedupIndex) -> str:
    """The :class:`RetentionWarning` of a batch whose documents all came without a time."""
    window = format_duration(index.retention.window)
    clock = (
        "the stream's clock is unset, so the window expires nothing"
        if index.timeline.clock == NO_CLOCK
        else "they took the stream's clock as it stood"
    )
    return (
        f"retention window {window} is in force, but no document of a batch had a time, and "
        f"{clock}: give add_many Document objects with time (Unix milliseconds), or open "
        "the detector with retention='none' (warned once per detector)"
    )


def _check_names(params: dict[str, Any]) -> None:
    """Unknown keyword arguments are a :class:`ConfigError` naming the known ones."""
    known = {f.name for f in dataclasses.fields(DedupConfig)}
    for name in sorted(params):
        if name not in known:
            raise ConfigError(name, f"not a detector parameter (known: {', '.join(sorted(known))})")


def _config(base: DedupConfig | None, params: dict[str, Any]) -> DedupConfig:
    """``params`` over ``base`` (the defaults when ``None``), by the same rule as the
    command line's flags over an existing index (:meth:`DedupConfig.updated`)."""
    try:
        return (base or DedupConfig()).updated(**params)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # e.g. a str where a number belongs
        raise ConfigError(", ".join(sorted(params)) or "config", str(exc)) from exc


def _open(
    path: str | os.PathLike[str] | None,
    config: DedupConfig | None,
    params: dict[str, Any],
    *,
    sync: bool,
    retention: RetentionChange,
) -> tuple[DedupIndex, DedupConfig]:
    """Open or create the index and settle the configuration (see :class:`Detector`)."""

    def choose(stored: DedupConfig | None) -> DedupConfig:
        return config if config is not None else _config(stored, params)

    where = None if path is None else Path(path)
    try:
        return open_or_create(where, choose, retention=retention, sync=sync)
    except OSError as exc:  # e.g. the path is a file, or not writable
        raise IndexStoreError(f"cannot open an index at {where}: {exc}") from exc


def _result(verdict: Verdict) -> QueryResult:
    if verdict.is_duplicate:
        return QueryResult(
            True, verdict.duplicate_of, verdict.similarity, verdict.cluster_id, verdict.empty
        )
    return QueryResult(False, None, None, None, verdict.empty)
