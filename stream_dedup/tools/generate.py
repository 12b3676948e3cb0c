"""A synthetic wire-story stream: originals and the publisher re-runs that copy them.

News pipelines see the same agency story many times: a regional site adds its masthead
and a subscription footer, another trims a paragraph, a third prepends an update, lines
get re-wrapped by a CMS, quotes turn into HTML entities, someone fixes (or makes) a typo.
This generator produces such a stream, deterministically for a seed, so tests, the demo
and the benchmarks share one realistic source without shipping a corpus.

Each record is a JSON object ``{"id", "title", "text", "publisher", "story", "kind",
"published"}``: ``story`` is the id of the original a re-run derives from (its own id for
an original), ``kind`` names the edits applied, ``published`` is the record's time
(ISO-8601 UTC, ``seconds_apart`` after the one before, from 2026-11-01; for retention).
These labels describe how a record was made, not whether it is a near-duplicate at a
given threshold: heavy edits can take a re-run below any threshold, so quality tests
compute exact ground truth rather than trusting the labels.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

_WORDS = tuple(
    (
        "government officials said the new plan would cut costs across several regions after "
        "months of talks with local leaders and unions who had warned that jobs were at risk "
        "while prices rose faster than wages in most cities the ministry announced on monday "
        "that it expected growth to slow this year because exports fell sharply amid weak "
        "demand from abroad analysts noted that investors remained cautious ahead of a key "
        "central bank meeting where interest rates could rise again police reported that "
        "residents were evacuated from homes near the river as heavy rain caused flooding in "
        "low lying areas emergency crews worked through the night to restore power to "
        "thousands of households the company confirmed that its chief executive would step "
        "down at the end of the quarter following a review of the board scientists published "
        "a study showing that warmer oceans are changing migration patterns of fish stocks "
        "which fishermen depend on for their income the team won the final after extra time "
        "with a late goal from the young striker whose season has drawn attention from larger "
        "clubs voters will return to the polls next month after the coalition collapsed over "
        "a dispute about the budget and health spending hospital staff described long queues "
        "doctors nurses patients schools teachers students parents court judge ruling appeal "
        "minister parliament election campaign rally protest strike border trade tariff deal "
        "market shares bonds currency inflation energy gas oil electricity wind solar climate "
        "storm drought harvest farmers wheat coffee shipping port airport flights railway"
    ).split()
)
_PUBLISHERS = (
    "Northern Courier",
    "Daily Meridian",
    "Harbour Post",
    "Valley Tribune",
    "Metro Wire",
    "Coastal Herald",
    "The Evening Ledger",
    "Capital Gazette",
)
_SYLLABLES = ("ka", "lo", "mir", "ten", "sa", "vo", "rin", "del", "ba", "nor", "ela", "tus")


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """Shape of the stream: how many records and how often a record is a re-run."""

    documents: int = 3000
    rerun_rate: float = 0.45
    seed: int = 7
    paragraphs: tuple[int, int] = (4, 7)
    #: Seconds between two records' ``published`` times.
    seconds_apart: int = 30


#: The ``published`` time of the first record (2026-11-01T00:00:00Z), Unix seconds.
START = 1_793_491_200


def published(n: int, spec: StreamSpec) -> str:
    """The ``published`` time of record ``n``."""
    when = datetime.fromtimestamp(START + n * spec.seconds_apart, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _sentence(rng: random.Random, names: list[str]) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(9, 18))]
    words[rng.randrange(len(words))] = rng.choice(names)
    if rng.random() < 0.4:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 9800)))
    text = " ".join(words)
    if rng.random() < 0.25:
        text += f', "{rng.choice(_WORDS)} {rng.choice(_WORDS)} & {rng.choice(_WORDS)}," she said'
    return text[0].upper() + text[1:] + "."


def _original(rng: random.Random, spec: StreamSpec) -> tuple[str, list[str]]:
    names = [_name(rng) for _ in range(3)]
    title = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 9))).capitalize()
    title += f" in {names[0]}"
    paras = [
        " ".join(_sentence(rng, names) for _ in range(rng.randint(1, 3)))
        for _ in range(rng.randint(*spec.paragraphs))
    ]
    return title, paras


def _typos(rng: random.Random, text: str, count: int) -> str:
    chars = list(text)
    for _ in range(count):
        if len(chars) < 3:
            break
        i = rng.randrange(1, len(chars) - 1)
        if rng.random() < 0.5:
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
        else:
            del chars[i]
    return "".join(chars)


def _rewrap(rng: random.Random, text: str) -> str:
    width = rng.randint(50, 80)
    out, line = [], 0
    for word in text.split(" "):
        if line + len(word) > width:
            out.append("\n")
            line = 0
        elif out:
            out.append(" ")
            line += 1
        out.append(word)
        line += len(word)
    return "".join(out)


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("'", "&#39;")


def _rerun(
    rng: random.Random, title: str, paras: list[str], publisher: str
) -> tuple[str, str, list[str]]:
    """A publisher's copy of a story: returns (title, text, edits applied)."""
    edits: list[str] = []
    paras = list(paras)
    if len(paras) > 3 and rng.random() < 0.3:
        del paras[rng.randrange(1, len(paras))]
        edits.append("dropped-paragraph")
    if rng.random() < 0.25:
        paras.insert(
            0, f"UPDATE {rng.randint(1, 23)}:{rng.randint(10, 59)} - {_sentence(rng, [publisher])}"
        )
        edits.append("update")
    if rng.random() < 0.6:
        paras.insert(0, f"By {publisher} staff and agencies | {rng.randint(1, 28)} November 2026")
        paras.append(f"(c) 2026 {publisher}. All rights reserved. Subscribe for unlimited access.")
        edits.append("header-footer")
    text = "\n\n".join(paras)
    if rng.random() < 0.3:
        text = _rewrap(rng, text)
        edits.append("rewrap")
    if rng.random() < 0.2:
        text = _entities(text)
        edits.append("html-entities")
    if rng.random() < 0.4:
        text = _typos(rng, text, rng.randint(1, 4))
        edits.append("typos")
    if rng.random() < 0.2:
        title = f"{title} | {publisher}"
        edits.append("title")
    return title, text, edits or ["verbatim"]


def generate(spec: StreamSpec) -> Iterator[dict[str, Any]]:
    """Yield ``spec.documents`` records in stream order (see the module docstring)."""
    rng = random.Random(spec.seed)
    # Only the last 200 stories are ever re-run: older ones are not kept (a long stream
    # would otherwise hold every original in memory).
    stories: deque[tuple[str, str, list[str]]] = deque(maxlen=200)
    for n in range(spec.documents):
        doc_id = f"doc-{n:06d}"
        publisher = rng.choice(_PUBLISHERS)
        if stories and rng.random() < spec.rerun_rate:
            recent = stories
            story_id, title, paras = recent[min(int(rng.expovariate(0.05)), len(recent) - 1)]
            title, text, edits = _rerun(rng, title, paras, publisher)
            yield {
                "id": doc_id,
                "title": title,
                "text": text,
                "publisher": publisher,
                "story": story_id,
                "kind": "+".join(edits),
                "published": published(n, spec),
            }
            continue
        title, paras = _original(rng, spec)
        stories.append((doc_id, title, paras))
        yield {
            "id": doc_id,
            "title": title,
            "text": "\n\n".join(paras),
            "publisher": publisher,
            "story": doc_id,
            "kind": "original",
            "published": published(n, spec),
        }


def write_jsonl(spec: StreamSpec, out: IO[str]) -> int:
    """Write the stream as JSON Lines; returns the number of records."""
    count = 0
    for record in generate(spec):
        out.write(json.dumps(record, ensure_ascii=False))
        out.write("\n")
        count += 1
    return count
