"""Plain data passed between the layers: documents in, verdicts out."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


class VerdictKind(StrEnum):
    """What the detector decided about one document."""

    UNIQUE = "unique"
    DUPLICATE = "duplicate"


#: Read once: on Python 3.11 every ``VerdictKind.DUPLICATE`` looks the member up through the
#: enum's metaclass, far slower than reading a module global, and ``is_duplicate`` is
#: asked several times per document.
_DUPLICATE = VerdictKind.DUPLICATE


@dataclass(frozen=True, slots=True)
class Document:
    """One document of the stream: a stable id, the text to compare, and its time.

    ``time`` is in Unix milliseconds (the Kafka message timestamp, or a field of the
    record); ``None`` when unknown. Retention measures the stream's clock on it
    (:mod:`stream_dedup.index.retention`); nothing else depends on it.
    """

    id: str
    content: str
    time: int | None = None


@dataclass(frozen=True, slots=True, init=False)
class Verdict:
    """The decision for one document.

    ``cluster_id`` is the id of the first document of the duplicate cluster (a unique
    document is its own cluster). ``empty`` marks content that normalised to nothing: such a
    document is ``unique``, never enters the index and never matches anything.
    ``replayed`` is True when the id had been decided before and the stored verdict was
    returned unchanged.

    ``revision`` numbers the texts an id was decided on (1: its first text; see
    ``docs/revisions.md``): an id seen again with another normalised text is decided again
    as revision 2, 3, ..., and ``previous`` is the text tag of the revision before
    (``""`` when that one was empty content; ``None`` for revision 1).

    With containment on (``docs/containment.md``) a duplicate also says how it relates to
    its match, ``relation`` (:class:`Relation`: ``near-duplicate``, or ``excerpt`` for a
    document most of whose text is in it), with ``containment`` the share of its
    shingles found there; and a unique document that holds most of an earlier one's text
    names it in ``contains`` (id, that document's share found here). All three are
    ``None`` with containment off, and the event is then the one it always was.
    """

    id: str
    verdict: VerdictKind
    duplicate_of: str | None
    similarity: float | None
    cluster_id: str
    empty: bool = False
    replayed: bool = False
    revision: int = 1
    previous: str | None = None
    relation: str | None = None
    containment: float | None = None
    contains: tuple[str, float] | None = None

    def __init__(
        self,
        id: str,
        verdict: VerdictKind,
        duplicate_of: str | None,
        similarity: float | None,
        cluster_id: str,
        empty: bool = False,
        replayed: bool = False,
        revision: int = 1,
        previous: str | None = None,
        relation: str | None = None,
        containment: float | None = None,
        contains: tuple[str, float] | None = None,
    ) -> None:
        # A frozen dataclass's own __init__ sets each field by name through
        # object.__setattr__; the slots' descriptors (_FIELD_SETTERS) set them at about
        # half the cost, for one verdict per document decided.
        (
            set_id,
            set_verdict,
            set_of,
            set_similarity,
            set_cluster,
            set_empty,
            set_replayed,
            set_revision,
            set_previous,
            set_relation,
            set_containment,
            set_contains,
        ) = _FIELD_SETTERS
        set_id(self, id)
        set_verdict(self, verdict)
        set_of(self, duplicate_of)
        set_similarity(self, similarity)
        set_cluster(self, cluster_id)
        set_empty(self, empty)
        set_replayed(self, replayed)
        set_revision(self, revision)
        set_previous(self, previous)
        set_relation(self, relation)
        set_containment(self, containment)
        set_contains(self, contains)

    @property
    def is_duplicate(self) -> bool:
        return self.verdict is _DUPLICATE

    def to_json(self) -> dict[str, Any]:
        """The event fields shared by the offline output and the Kafka events.

        ``verdict`` is the :class:`VerdictKind` itself, a ``str`` that JSON encoders write
        as its value (reading ``.value`` off an enum costs more than encoding the event).
        ``revision`` and ``previous`` are written only from revision 2 on: the events of an
        id's first text are those of a stream without revisions, byte for byte.
        """
        body: dict[str, Any] = {
            "id": self.id,
            "verdict": self.verdict,
            "duplicate_of": self.duplicate_of,
            "similarity": self.similarity,
        }
        if self.relation is not None:
            body["relation"] = self.relation
            body["containment"] = self.containment
        body["cluster_id"] = self.cluster_id
        if self.contains is not None:
            body["contains"] = {"id": self.contains[0], "containment": self.contains[1]}
        if self.revision != 1:
            body["revision"] = self.revision
            body["previous"] = self.previous
        return body


class Relation(StrEnum):
    """How an earlier document found by a check relates to the text checked.

    ``near-duplicate``: similar at or above the detector's threshold (what a verdict
    would call a duplicate); ``excerpt``: below it, but at least the containment
    setting's share of the text's shingles are in it (only with containment on);
    ``similar``: a candidate below both, with its scores. An open set: a reader should
    pass over a value it does not know.
    """

    NEAR_DUPLICATE = "near-duplicate"
    SIMILAR = "similar"
    EXCERPT = "excerpt"


@dataclass(frozen=True, slots=True)
class CheckMatch:
    """An earlier document a check found, with exact scores against the checked text.

    ``similarity`` is the Jaccard similarity of the two shingle sets (the number a verdict
    reports); ``containment`` the share of the *checked text's* shingles found in this
    document (near 1.0: the text is an excerpt of it, or a copy), and
    ``reverse_containment`` the share of this document's shingles found in the text (near
    1.0: the text contains it). Both are ``None`` when the index verifies by signature
    (``verify = "signature"``): it stores no shingles to count, and ``similarity`` is then
    the signatures' estimate. ``cluster_id`` is the document's cluster.
    """

    id: str
    similarity: float
    containment: float | None
    reverse_containment: float | None
    cluster_id: str
    relation: Relation

    def to_json(self) -> dict[str, Any]:
        """The match as the command line and the HTTP port write it."""
        return {
            "id": self.id,
            "similarity": self.similarity,
            "containment": self.containment,
            "reverse_containment": self.reverse_containment,
            "cluster_id": self.cluster_id,
            "relation": self.relation,
        }


#: Each field's slot setter, in field order (see Verdict.__init__).
_FIELD_SETTERS: tuple[Any, ...] = tuple(Verdict.__dict__[f.name].__set__ for f in fields(Verdict))
