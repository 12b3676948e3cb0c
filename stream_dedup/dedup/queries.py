"""Asking about texts without indexing them: each decided against the index alone.

Deciding a batch lets each document see the earlier ones; a query must not. The texts
are decided under ids no document has (:func:`unused_ids`), in groups whose texts share
no lookup key (:func:`independent_groups`), and nothing is committed, so the index is
left exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count

from stream_dedup.dedup.deduplicator import Deduplicator
from stream_dedup.index.store import DedupIndex
from stream_dedup.models import Document, Verdict


def query_verdicts(dedup: Deduplicator, texts: Sequence[str]) -> list[Verdict]:
    """The verdict each of ``texts`` would get if it were added alone now, as a new id;
    nothing is written."""
    ids = unused_ids(dedup.index, len(texts))
    docs = [Document(i, t) for i, t in zip(ids, texts, strict=True)]
    verdicts: list[Verdict | None] = [None] * len(docs)
    sketched = dedup.sketch(docs)
    groups = independent_groups(len(docs), sketched.live, sketched.bucket_keys, sketched.exact_keys)
    for group in groups:
        whole = len(group) == len(docs)
        decided = dedup.decide(
            docs if whole else [docs[i] for i in group], sketched if whole else None
        )
        for i, verdict in zip(group, decided.verdicts, strict=True):
            verdicts[i] = verdict
    return [v for v in verdicts if v is not None]


def unused_ids(index: DedupIndex, n: int) -> list[str]:
    """``n`` ids that no document of the index has, for texts that are only asked about.

    A query is decided under an id of its own; one the index had decided would return that
    document's stored verdict instead. These ids start with a NUL, which no sensible id
    does, and are checked against the index all the same.
    """
    for attempt in count():
        ids = [f"\x00query {attempt}:{i}" for i in range(n)]
        if not index.has_decided(ids):
            return ids
    raise AssertionError("unreachable")  # pragma: no cover


def independent_groups(
    n_docs: int, live: Sequence[int], bucket_keys: Sequence[bytes], exact_keys: Sequence[bytes]
) -> list[list[int]]:
    """Positions of a batch's documents in groups whose documents share no lookup key.

    Deciding a batch lets each document see the earlier ones (their exact texts and band
    bucket appends). Documents that share no band bucket and no exact text cannot see each
    other, so each group decides every query against the index alone, as if asked one at a
    time. A document goes to the group after the last one holding any of its keys; texts
    that are not near-duplicates of one another all land in the first group.
    """
    n_live = len(live)
    bands = len(bucket_keys) // n_live if n_live else 0
    last_group: dict[bytes, int] = {}
    group_of: dict[int, int] = {}
    for p, doc_index in enumerate(live):
        doc_keys = [*bucket_keys[p * bands : (p + 1) * bands], exact_keys[p]]
        g = 1 + max((last_group.get(k, -1) for k in doc_keys), default=-1)
        for k in doc_keys:
            last_group[k] = g
        group_of[doc_index] = g
    groups: list[list[int]] = [[] for _ in range(1 + max(group_of.values(), default=0))]
    for i in range(n_docs):
        groups[group_of.get(i, 0)].append(i)  # empty texts: nothing to share, group 0
    return [g for g in groups if g]
