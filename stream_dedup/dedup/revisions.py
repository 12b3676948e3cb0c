"""Which documents of a batch repeat an id, and whether each replays a revision or adds one.

An id is decided once per normalised text (see ``docs/revisions.md``). A document whose id
was decided before, in the index or earlier in the same batch, is a *repeat*: with a text
the id has had it replays that revision's stored verdict; with another text it is a new
revision, decided like any document (``revisions = "decide"``) or, under
``revisions = "replay"``, given the id's latest verdict back as before revisions existed.

The plan depends only on the sequence of ids and texts, never on verdicts, so it is made
before the matching pass (which must know which documents it decides) and the writes
follow it to the letter: a batch decided again over the same index gets the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stream_dedup.core.config import RevisionMode
from stream_dedup.index.staged import StoredVerdict, text_of

__all__ = ["Repeat", "RevisionMode", "plan_repeats"]


@dataclass(frozen=True, slots=True)
class Repeat:
    """What a document whose id was decided before is."""

    #: The revision it is (replayed) or becomes (decided now); 1 is the id's first text.
    revision: int
    #: The text of the revision before ``revision`` (``None`` for revision 1).
    previous: str | None
    #: True: its verdict is the stored one of ``revision``; False: it is decided now.
    replay: bool
    #: A replay under ``revisions = "replay"`` whose text no revision of the id had.
    differs: bool = False


def plan_repeats(
    ids: Sequence[str],
    texts: Sequence[bytes | None],
    stored: Sequence[StoredVerdict | None],
    mode: RevisionMode,
) -> dict[int, Repeat]:
    """Per position of a document whose id was decided before (in the index: ``stored``;
    or earlier in the batch), what it is. ``texts`` are the documents' exact-text keys
    (``None``: empty content).

    A revision whose text is unknown (a record of the older format without tags) matches
    any text: such an id replays as before, never gaining a revision it cannot tell apart.
    """
    seen: dict[str, list[str | None]] = {}  # id -> its revisions' texts so far
    plan: dict[int, Repeat] = {}
    for i, doc_id in enumerate(ids):
        had = seen.get(doc_id)
        text = text_of(texts[i])
        if had is None:
            record = stored[i]
            if record is None:
                seen[doc_id] = [text]
                continue
            had = seen[doc_id] = record.texts(doc_id)
        at = next((n for n, t in enumerate(had) if t is None or t == text), None)
        if at is not None:
            plan[i] = Repeat(at + 1, had[at - 1] if at else None, replay=True)
        elif mode == "replay":
            last = len(had)
            plan[i] = Repeat(last, had[-2] if last > 1 else None, replay=True, differs=True)
        else:
            plan[i] = Repeat(len(had) + 1, had[-1], replay=False)
            had.append(text)
    return plan
