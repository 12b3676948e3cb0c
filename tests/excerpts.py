"""A news stream with excerpt copies, and its exact containment truth by brute force.

Papers often print only the first paragraphs of a wire story, or a block from its
middle, under their own header and footer. Such a copy holds 25-65 % of the original's
text: its Jaccard with the original is far below any useful threshold, yet nearly all of
its own text was seen before. This stream mixes the generator's stories and re-runs
(:mod:`stream_dedup.tools.generate`, near-duplicates as the quality tests see them) with
such excerpts, some with light word edits, deterministically for a seed.

The truth is independent of the package's hashing, as in ``tests/quality``: shingles are
the plain strings (character 5-grams of the normalised text), a sparse document x
shingle matrix ``X`` gives every pairwise intersection at once (``X @ X.T``), and from
it the containment ``|D ∩ E| / |D|`` and the Jaccard of every document D in every
earlier document E.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_dedup.core.normalize import normalize
from stream_dedup.tools.generate import StreamSpec, generate
from tests.shingle_truth import shingle_matrix, string_shingles

#: Share of the original's text an excerpt keeps.
EXCERPT_SHARE = (0.25, 0.65)

_HEADERS = (
    "{pub} | Regional news desk",
    "From the wires, {pub} edition",
    "{pub} morning briefing",
)
_FOOTERS = (
    "Read the full story on the {pub} website.",
    "This excerpt first appeared in the {pub} print edition. Letters to the editor welcome.",
    "More from {pub}: subscribe to our newsletter.",
)
_EDIT_WORDS = ("reportedly", "officially", "again", "locally", "now", "still")


@dataclass(frozen=True)
class ExcerptStream:
    """Records in stream order (``{"id", "title", "text", "kind", "source"}``): ``kind``
    is ``original``, ``rerun`` or ``excerpt`` (how the record was made, not a verdict),
    ``source`` the original an excerpt or re-run was taken from."""

    records: list[dict[str, Any]]

    @property
    def contents(self) -> list[str]:
        return [r["title"] + "\n" + r["text"] for r in self.records]


def _block(rng: random.Random, paras: list[str]) -> list[str] | None:
    """A run of paragraphs (leading, or inner half the time) holding 25-65 % of the text."""
    total = sum(len(p) for p in paras)
    runs = [
        (a, b)
        for a in range(len(paras))
        for b in range(a + 1, len(paras) + 1)
        if EXCERPT_SHARE[0] <= sum(len(p) for p in paras[a:b]) / total <= EXCERPT_SHARE[1]
    ]
    if not runs:
        return None
    leading = [r for r in runs if r[0] == 0]
    pick = rng.choice(leading if leading and rng.random() < 0.5 else runs)
    return paras[pick[0] : pick[1]]


def _edit_words(rng: random.Random, text: str, count: int) -> str:
    """Light word edits: a word dropped or inserted, as a copy desk trims a sentence."""
    words = text.split(" ")
    for _ in range(count):
        i = rng.randrange(len(words))
        if rng.random() < 0.5 and len(words) > 3:
            del words[i]
        else:
            words.insert(i, rng.choice(_EDIT_WORDS))
    return " ".join(words)


def excerpt_stream(
    documents: int = 4000, seed: int = 11, excerpt_rate: float = 0.2
) -> ExcerptStream:
    """``documents`` records: the generator's stream with excerpts of recent originals
    inserted at ``excerpt_rate``."""
    rng = random.Random(seed)
    source = generate(StreamSpec(documents=documents, seed=seed))
    originals: deque[dict[str, Any]] = deque(maxlen=200)
    records: list[dict[str, Any]] = []
    while len(records) < documents:
        n = len(records)
        if originals and rng.random() < excerpt_rate:
            story = originals[min(int(rng.expovariate(0.05)), len(originals) - 1)]
            block = _block(rng, story["text"].split("\n\n"))
            if block is not None:
                pub = rng.choice(("Harbour Post", "Valley Tribune", "Metro Wire", "Sun Ledger"))
                text = "\n\n".join(block)
                if rng.random() < 0.3:
                    text = _edit_words(rng, text, rng.randint(1, 3))
                head, foot = rng.choice(_HEADERS), rng.choice(_FOOTERS)
                text = f"{head.format(pub=pub)}\n\n{text}\n\n{foot.format(pub=pub)}"
                title = story["title"] if rng.random() < 0.5 else f"{pub}: in brief"
                records.append(
                    {"id": f"ex-{n:06d}", "title": title, "text": text, "kind": "excerpt",
                     "source": story["id"]}
                )  # fmt: skip
                continue
        record = next(source)
        kind = "original" if record["kind"] == "original" else "rerun"
        records.append(
            {"id": record["id"], "title": record["title"], "text": record["text"], "kind": kind,
             "source": record["story"]}
        )  # fmt: skip
        if kind == "original":
            originals.append(records[-1])
    return ExcerptStream(records)


@dataclass(frozen=True)
class ContainmentTruth:
    """Exact containment and Jaccard of each document in each earlier one.

    ``containment[d, e]`` (for ``e < d``) is ``|D ∩ E| / |D|``, ``jaccard[d, e]`` the
    Jaccard; both are 0 on and above the diagonal. ``best[d]`` is D's highest containment
    in an earlier document, ``source[d]`` that document (ties: the earliest; -1 when D
    shares nothing with any), ``best_jaccard[d]`` D's highest Jaccard with an earlier one.
    """

    sizes: npt.NDArray[np.int64]
    containment: npt.NDArray[np.float64]
    jaccard: npt.NDArray[np.float64]

    @property
    def best(self) -> npt.NDArray[np.float64]:
        return self.containment.max(axis=1)

    @property
    def source(self) -> npt.NDArray[np.int64]:
        found = self.containment.argmax(axis=1)  # the first maximum: the earliest
        return np.where(self.best > 0, found, -1).astype(np.int64)

    @property
    def best_jaccard(self) -> npt.NDArray[np.float64]:
        return self.jaccard.max(axis=1)

    def reverse(self) -> npt.NDArray[np.float64]:
        """``reverse[d]``: the highest share of an earlier document's text found in D."""
        inter = self.containment * self.sizes[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(self.sizes[None, :] > 0, inter / self.sizes[None, :], 0.0)
        return np.asarray(share.max(axis=1))


def containment_truth(contents: list[str]) -> ContainmentTruth:
    """Brute force over string shingle sets: one sparse product, dense results."""
    sizes, x = shingle_matrix([string_shingles(normalize(c)) for c in contents])
    inter = np.tril((x @ x.T).toarray().astype(np.float64), k=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        containment = np.where(sizes[:, None] > 0, inter / sizes[:, None], 0.0)
        union = sizes[:, None] + sizes[None, :] - inter
        jaccard = np.where(union > 0, inter / union, 0.0)
    return ContainmentTruth(sizes, containment, np.tril(jaccard, k=-1))
