"""The one exception tree of stream-dedup.

Every exception class the package defines derives from :class:`StreamDedupError`, so a
caller can catch one type (``tests/test_errors.py`` checks that no class is left out).
Each carries the context an operator needs to act. Classes live here unless another
module is named::

    StreamDedupError                  root; raised as is where no branch fits (an
    │                                 optional dependency missing)
    ├── ConfigError                   a bad setting (names the key)
    ├── DecodeError                   one input record cannot become a Document (keeps
    │                                 the raw input); dead-lettered, never stops a run
    ├── InputError                    an input file or stream cannot be read
    │   └── MalformedLineError        offline.py: a bad line under ``--on-error fail``
    ├── IndexStoreError               base for problems with the index (RocksDB or Redis); the
    │   │                             service and the commands stop (exit code 3)
    │   ├── IndexMismatchError        the index on disk was built with other parameters
    │   ├── IndexLockedError          another process already writes this index directory
    │   ├── IndexCorruptError         stored bytes do not parse
    │   ├── IndexLostError            the index is empty but the consumer group has
    │   │   │                         committed offsets (``index.on_lost = "fail"``)
    │   │   └── IndexOffsetsGoneError the index's offsets are below what the broker
    │   │                             retains (expired before they were decided)
    │   └── IndexIOError              the index could not be read or written (disk,
    │       │                         permissions, a closed database): the service
    │       │                         stops without dead-lettering; fix and restart
    │       ├── IndexUnreachableError the shared index's Redis cannot be reached or
    │       │                         refused a command (a running service retries up
    │       │                         to index.redis.outage_limit_s first)
    │       └── IndexLeaseLostError   another instance took the shared index's lease
    │                                 before this one stored its batch
    ├── SketchWorkerError             service/prefetch/worker.py: the sketch worker failed
    │                                 on a batch; the service sketches it in process
    ├── StartInterruptedError         service/stopping.py: a stop came while the service
    │                                 started; it returns 0 before any Kafka client
    ├── DeliveryAbandonedError        service/kafka.py: deliveries were unconfirmed when
    │                                 the service stopped; the batch is replayed
    ├── RecordRefusedError            the dead-letter topic refused a dead letter even
    │                                 without its value (service/refusals.py): the service
    │                                 stops (exit code 1)
    ├── TransactionError              exactly-once delivery cannot go on (fenced by another
    │                                 instance, a fatal producer error, offsets unreadable
    │                                 at start): the service stops (exit code 1)
    ├── BrokerStartError              tools/broker.py: the local broker did not start
    ├── ProduceError                  tools/produce.py: some lines were not delivered
    └── RetentionWarning              also a ``UserWarning``, issued (``warnings.warn``),
                                      not raised: a retention window with no document
                                      time to measure (the Python API, once per detector)

What is *not* in the tree is a bug or the environment: ``ValueError``/``RuntimeError``
from misuse of an internal API, ``OSError``, ``MemoryError``. The service tells the two
apart when a batch fails (:mod:`stream_dedup.service.decide`): an index or environment
error stops it, while any other exception is blamed on the documents that raise it alone.
"""

from __future__ import annotations


class StreamDedupError(Exception):
    """Root of every error stream-dedup raises on purpose."""


class ConfigError(StreamDedupError):
    """A configuration value is missing, unknown or of the wrong type."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"configuration key {key!r}: {problem}")
        self.key = key
        self.problem = problem


class DecodeError(StreamDedupError):
    """One input record cannot be turned into a document.

    ``reason`` is a short, stable, machine-readable code (used as a metric label and a
    dead-letter header); ``detail`` is the human explanation. ``raw`` keeps the original
    bytes so nothing is lost when the record is dead-lettered or reported.
    """

    REASONS = (
        "invalid_json",
        "not_an_object",
        "missing_id",
        "invalid_id",
        "missing_content",
        "invalid_content",
        "invalid_utf8",
        "too_large",
        "processing_error",
    )

    def __init__(self, reason: str, detail: str, raw: bytes | None = None) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown decode reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.raw = raw


class IndexStoreError(StreamDedupError):
    """Base for problems with the index: a RocksDB directory or a shared index on Redis."""


class IndexMismatchError(IndexStoreError):
    """The index was built with parameters other than the ones asked for."""

    def __init__(self, path: str, differences: dict[str, tuple[object, object]]) -> None:
        lines = ", ".join(
            f"{key}: index has {stored!r}, asked for {wanted!r}"
            for key, (stored, wanted) in sorted(differences.items())
        )
        super().__init__(
            f"index at {path} was built with other parameters ({lines}). "
            "Signatures and band keys depend on them, so the index cannot be reused: either "
            "run with the index's parameters (see `stream-dedup stats --index DIR`), or build a "
            "new index in an empty directory (re-index from the source)."
        )
        self.path = path
        self.differences = differences


class IndexLockedError(IndexStoreError):
    """Another process holds a RocksDB index's write lock: a directory has one writer (a
    shared index on Redis has several, which take turns instead)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"index at {path} is already open by another process ({detail}). An index directory "
            "has exactly one writer: stop the other stream-dedup process or point this one at a "
            "different --index directory."
        )
        self.path = path


class IndexCorruptError(IndexStoreError):
    """Stored bytes in the index could not be parsed."""


class IndexLostError(IndexStoreError):
    """The index holds nothing, yet the consumer group has committed offsets: the index
    was lost (a deleted directory, a Redis restarted without its data, another path), and
    resuming from the group's offsets would call every copy of what it forgot unique."""

    def __init__(self, location: str, committed: dict[str, int]) -> None:
        shown = ", ".join(f"{tp} at offset {o}" for tp, o in sorted(committed.items())[:5])
        super().__init__(
            f"the index at {location} is empty, but the consumer group has committed offsets "
            f"({shown}{', ...' if len(committed) > 5 else ''}): the index was lost or this is "
            "the wrong index. Restore it (e.g. `stream-dedup restore`) or point index.path at "
            'it; or set index.on_lost = "rebuild" to decide again from the earliest retained '
            'messages, or "continue" to resume from the group\'s offsets with an empty index.'
        )
        self.location = location
        self.committed = committed


class IndexOffsetsGoneError(IndexLostError):
    """The index's offsets for some partitions are below the earliest offset the broker
    retains: the service was down longer than the topic's retention, and the messages
    between were never decided."""

    def __init__(self, location: str, gone: dict[str, tuple[int, int, int]]) -> None:
        shown = ", ".join(
            f"{tp} at offset {o} (the broker holds {lo} to {hi})"
            for tp, (o, lo, hi) in sorted(gone.items())[:5]
        )
        IndexStoreError.__init__(
            self,
            f"the index at {location} resumes at offsets the broker no longer has "
            f"({shown}{', ...' if len(gone) > 5 else ''}): those messages expired before "
            "they were decided. Check the topic's retention; set index.on_lost = "
            '"continue" (or "rebuild") to go on from the earliest retained messages.',
        )
        self.location = location
        self.committed = {tp: o for tp, (o, _lo, _hi) in gone.items()}
        self.gone = gone


class InputError(StreamDedupError):
    """An input file or stream cannot be read."""


class IndexIOError(IndexStoreError):
    """The index's database could not be read or written (an I/O error, a full disk, a
    closed handle).

    Raised instead of the storage library's own exceptions, so callers can tell a broken
    index apart from a bug triggered by one document's content: the former must stop
    the service before anything is committed, the latter only costs that document.
    """

    def __init__(self, path: str, operation: str, detail: str) -> None:
        super().__init__(
            f"index at {path}: {operation} failed ({detail}). A failed write stores "
            "nothing (each write is atomic): check the disk (free space, permissions, I/O "
            "errors in the system log), then start again: the service replays the batch it "
            "was processing, and a document already stored is never decided twice."
        )
        self.path = path
        self.operation = operation
        self.detail = detail


class IndexLeaseLostError(IndexIOError):
    """Another instance took the shared index's lease before this one wrote its batch."""

    def __init__(self, location: str) -> None:
        StreamDedupError.__init__(
            self,
            f"index on {location}: another instance took the index's lease while this one "
            "was stopped longer than index.redis.lock_ttl_ms, so its batch was not stored. "
            "Start again (the batch is consumed again); if it recurs, raise lock_ttl_ms "
            "above the longest pause of the process.",
        )
        self.path = location
        self.operation = "writing"
        self.detail = "lease lost"


class IndexUnreachableError(IndexIOError):
    """The shared index's Redis could not be reached or refused a command."""

    def __init__(self, location: str, operation: str, detail: str) -> None:
        StreamDedupError.__init__(
            self,
            f"index on {location}: {operation} failed ({detail}). Check that Redis is up "
            "and that index.redis.url (and password or TLS settings) reach it, then start "
            "again: a batch not stored is consumed again, and a document already stored "
            "gets its stored verdict back.",
        )
        self.path = location
        self.operation = operation
        self.detail = detail


class RecordRefusedError(StreamDedupError):
    """A record was refused for good and nothing smaller can replace it: the dead-letter
    topic refuses even a dead letter without its value (authorization, a topic policy).
    Stopping keeps the record: its input message is consumed again at the next start."""

    def __init__(self, topic: str, detail: str) -> None:
        super().__init__(
            f"the broker refused a record for {topic} for good ({detail}) and it has no "
            "smaller replacement: check that the service may write the dead-letter topic "
            "(output.dlq_topic) and its limits, then start again; the batch is consumed again"
        )
        self.topic = topic
        self.detail = detail


class TransactionError(StreamDedupError):
    """The service's transactional producer cannot go on: another instance with the same
    ``transactional.id`` fenced it, the producer hit a fatal error, or the group's offsets
    could not be read at start-up. The service stops; the batch in hand is replayed from
    its intent at the next start (:mod:`stream_dedup.service.transactions`)."""


class RetentionWarning(UserWarning, StreamDedupError):  # noqa: N818 (a warning, named so)
    """A retention window is in force but documents came without a time.

    Issued with :func:`warnings.warn` by :class:`~stream_dedup.api.Detector`, once per
    detector, when every document of a batch lacks a time: the window cannot expire them
    on time (while the stream's clock is unset it expires nothing). A ``UserWarning``, so
    the usual warning filters apply (``warnings.simplefilter("error", RetentionWarning)``
    raises it, as a :class:`StreamDedupError` like every other error of the package).
    """
