"""Follow one batch through the service code: which modules it passes through, and how often
it comes back to one it had left.

Not a timing. The script starts an embedded Tansu broker (``stream_dedup.tools.broker``),
creates a one-partition input topic, produces ``--docs`` JSON documents
(``{"id": ..., "text": ...}``, a fifth of them near-copies of earlier ones), and runs
``stream_dedup.service.loop.Service`` in this process, in the main thread, on a fresh
RocksDB index, at-least-once delivery, with ``service.sketch_worker = false`` (a batch is
collected, decided and committed in the same turn of the loop), HTTP off, and librdkafka's
statistics callback off (``statistics.interval.ms = 0``: it fires on a timer, from inside
``poll``, and is no part of a batch's life).

A profile function (``sys.setprofile``, main thread only) records every ``call`` event
whose code lives in the ``stream_dedup`` package, as the module's name (generator resumes
and comprehensions count as calls of their module; compiled kernels and C functions do
not appear). Only calls are recorded, not returns: coming back to a caller's module shows
only when that module calls one of its own functions again.

One batch is cut out of the record: from the entry into ``Batcher.collect`` of the
``--nth`` turn of the loop whose collect returned messages (``collect(self, *, wait)`` in
the current code, ``collect(self, consumer, *, wait)`` before the BatchLife refactoring),
up to the next entry into ``Batcher.collect``, which comes after that batch was decided and
committed. Then a timer thread calls ``Service.stop()``. Consecutive calls in one module
are collapsed into one step; reported are

* **distinct**: how many different modules the collapsed sequence has;
* **returns**: how many steps enter a module that appeared earlier in the sequence (the
  step before is always another module, by the collapsing).

Most of those returns are per-document loops (the merge and ``service.kafka`` for each
message collected, ``service.config`` and ``service.events`` for each event built, the
matching's records), so they grow with the batch. The same counts are therefore also
given with repetitions folded: every run of consecutive repetitions of a window of 2 to 8
steps (``A > B > A > B > A > B`` is ``(A > B)x3``) counts once, i.e. a loop's body is
followed once, and the sequence is collapsed again. The folded sequence is what is printed
(``--full`` adds the unfolded one).

Both kinds of count are given twice: over every ``stream_dedup`` module, and over the
service level only (``stream_dedup.service.*``, the ``stream_dedup.dedup`` layer as one
unit, and the index's face ``DedupIndex`` as one unit: ``stream_dedup.index`` and its
``store``, ``reads``, ``pending`` and ``staged`` modules; not ``core/*``, the index's backends
and records, ``logs``, ``models``, ``decode``); for the second, the other modules' calls are
dropped before collapsing.

The defaults (400 documents, ``batch.max_messages`` 200, ``--nth 2``) trace the second
batch, so that neither the partition assignment (whose callback may run inside the first
``collect`` that gets messages) nor first-write work in the index is in it. The trace still
holds the commit callback of the batch before (``checkpoint.kafka_commit_reporter``, run
by librdkafka inside this batch's ``poll``) and, at its end, the loop's next turn up to
``collect`` (``Service._beat``, ``gc_tuning``).

The package traced is whichever ``import stream_dedup`` finds (printed first), so another
checkout's code is traced with ``PYTHONPATH`` ahead of the editable install::

    .venv/bin/python bench/trace_batch.py
    git worktree add /tmp/base-7bd2856 7bd2856
    PYTHONPATH=/tmp/base-7bd2856 .venv/bin/python bench/trace_batch.py
    .venv/bin/python bench/trace_batch.py --docs 600 --batch-size 200 --nth 2
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from confluent_kafka import Producer

import stream_dedup
from stream_dedup.service.batches import Batcher
from stream_dedup.service.config_loading import build_config
from stream_dedup.service.loop import Service
from stream_dedup.tools.broker import EmbeddedBroker, create_topics

PACKAGE_DIR = Path(stream_dedup.__file__).resolve().parent
#: The longest window of steps that :func:`fold` looks for repetitions of.
FOLD_LONGEST = 8
#: At the service level, the dedup layer counts as one unit (a module before it became a
#: package), and so does the index's face, ``DedupIndex`` (its reads, its commit
#: preparation and its intent and offsets were in ``index/store.py`` before they got
#: modules of their own).
SERVICE_UNITS = {
    "stream_dedup.dedup": "stream_dedup.dedup",
    "stream_dedup.index": "stream_dedup.index.store",
    "stream_dedup.index.store": "stream_dedup.index.store",
    "stream_dedup.index.reads": "stream_dedup.index.store",
    "stream_dedup.index.pending": "stream_dedup.index.store",
    "stream_dedup.index.progress": "stream_dedup.index.store",
    "stream_dedup.index.staged": "stream_dedup.index.store",
}

WORDS = (
    "market city council river school train weather report price energy water road "
    "festival museum hospital football election budget harbour bridge storm farm"
).split()


def documents(n: int, seed: int = 7) -> list[dict[str, str]]:
    """``n`` documents of ~40 words; every fifth a copy of an earlier one with 3 words changed."""
    rng = random.Random(seed)
    docs: list[dict[str, str]] = []
    for i in range(n):
        if i >= 5 and i % 5 == 0:
            words = docs[rng.randrange(i)]["text"].split()
            for _ in range(3):
                words[rng.randrange(len(words))] = rng.choice(WORDS)
        else:
            words = [rng.choice(WORDS) for _ in range(40)]
        docs.append({"id": f"d{i}", "text": " ".join(words)})
    return docs


def service_unit(module: str) -> str | None:
    """The service-level unit ``module`` belongs to, or None for the layers below."""
    if module.startswith("stream_dedup.service."):
        return module
    if module.startswith("stream_dedup.dedup."):
        return "stream_dedup.dedup"
    return SERVICE_UNITS.get(module)


class Recorder:
    """The profile function: modules of ``stream_dedup`` calls, and where each collect began
    and whether it returned messages."""

    def __init__(self, nth: int) -> None:
        self.nth = nth
        self.calls: list[str] = []
        self.collect_starts: list[int] = []  # index into calls of each collect's entry
        self.nonempty: list[int] = []  # number (0-based) of each collect that returned messages
        self.batch_sizes: dict[int, int] = {}
        self.done = threading.Event()
        self._collect = Batcher.collect.__code__
        self._modules: dict[CodeType, str | None] = {}

    def _module(self, code: CodeType) -> str | None:
        try:
            return self._modules[code]
        except KeyError:
            pass
        name: str | None = None
        path = Path(code.co_filename)
        if path.suffix == ".py":
            try:
                rel = path.resolve().relative_to(PACKAGE_DIR)
            except ValueError:
                rel = None
            if rel is not None:
                parts = ["stream_dedup", *rel.with_suffix("").parts]
                if parts[-1] == "__init__":
                    parts.pop()
                name = ".".join(parts)
        self._modules[code] = name
        return name

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done.is_set():
            return
        if event == "call":
            code = frame.f_code
            module = self._module(code)
            if module is None:
                return
            if code is self._collect:
                if len(self.nonempty) >= self.nth:  # the traced batch is over
                    self.collect_starts.append(len(self.calls))
                    self.done.set()
                    return
                self.collect_starts.append(len(self.calls))
            self.calls.append(module)
        elif event == "return" and frame.f_code is self._collect and arg:
            self.nonempty.append(len(self.collect_starts) - 1)
            self.batch_sizes[len(self.collect_starts) - 1] = len(arg)

    def segment(self) -> tuple[list[str], int]:
        """The calls of the ``nth`` non-empty collect's turn, and its batch's size."""
        which = self.nonempty[self.nth - 1]
        start, end = self.collect_starts[which], self.collect_starts[which + 1]
        return self.calls[start:end], self.batch_sizes[which]


def collapse(modules: Sequence[str]) -> list[str]:
    out: list[str] = []
    for m in modules:
        if not out or out[-1] != m:
            out.append(m)
    return out


def counts(seq: Sequence[str]) -> tuple[int, int]:
    """(distinct modules, returns) of a collapsed sequence."""
    seen: set[str] = set()
    returns = 0
    for m in seq:
        if m in seen:
            returns += 1
        seen.add(m)
    return len(seen), returns


#: A module, or a run of consecutive repetitions of a shorter sequence: (inner, times).
Token = str | tuple[tuple["Token", ...], int]


def fold(seq: Sequence[str], longest: int = FOLD_LONGEST) -> list[Token]:
    """``seq`` with every run of consecutive repetitions of a window of 2 to ``longest``
    steps replaced by one group (the window, how many times), until none is left."""
    tokens: list[Token] = list(seq)
    changed = True
    while changed:
        changed = False
        for k in range(2, longest + 1):
            out: list[Token] = []
            i = 0
            while i < len(tokens):
                window = tokens[i : i + k]
                n = 1
                while len(window) == k and tokens[i + n * k : i + (n + 1) * k] == window:
                    n += 1
                if n > 1:
                    out.append((tuple(window), n))
                    i += n * k
                    changed = True
                else:
                    out.append(tokens[i])
                    i += 1
            tokens = out
    return tokens


def once(tokens: Sequence[Token]) -> list[str]:
    """The modules of ``tokens`` with every group's window taken once, collapsed."""
    flat: list[str] = []
    for t in tokens:
        flat += [t] if isinstance(t, str) else once(t[0])
    return collapse(flat)


def show(tokens: Sequence[Token]) -> str:
    parts = []
    for t in tokens:
        if isinstance(t, str):
            parts.append(t.removeprefix("stream_dedup."))
        else:
            parts.append(f"({show(t[0])})x{t[1]}")
    return " > ".join(parts)


def produce(bootstrap: str, topic: str, docs: list[dict[str, str]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for d in docs:
        producer.produce(topic, json.dumps(d).encode())
        producer.poll(0)
    if producer.flush(30) != 0:
        raise SystemExit("documents not delivered to the broker")


def config(bootstrap: str, topic: str, index: Path, batch_size: int) -> Any:
    return build_config(
        [
            {
                "input": {"topics": [topic]},
                "index": {"path": str(index)},
                "http": {"enabled": False},
                "batch": {"max_messages": batch_size, "max_wait_ms": 20},
                "service": {
                    "sketch_worker": False,
                    "shutdown_timeout_s": 20.0,
                    "backoff_initial_s": 0.1,
                },
                "kafka": {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"g-{topic}",
                    "session.timeout.ms": "6000",
                    "heartbeat.interval.ms": "1000",
                    "statistics.interval.ms": "0",
                },
            }
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=400, help="documents produced (400)")
    ap.add_argument("--batch-size", type=int, default=200, help="batch.max_messages (200)")
    ap.add_argument("--nth", type=int, default=2, help="which non-empty batch to trace (2)")
    ap.add_argument("--full", action="store_true", help="also print the unfolded sequences")
    ap.add_argument("--timeout", type=float, default=120.0, help="give up after (s)")
    args = ap.parse_args(argv)
    print(f"stream_dedup: {stream_dedup.__file__}")

    recorder = Recorder(args.nth)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        topic = f"trace-{uuid.uuid4().hex[:8]}"
        create_topics(broker.bootstrap, [topic])
        create_topics(broker.bootstrap, [f"{topic}.unique", f"{topic}.duplicates", f"{topic}.dlq"])
        produce(broker.bootstrap, topic, documents(args.docs))
        svc = Service(config(broker.bootstrap, topic, Path(tmp) / "index", args.batch_size))

        def stop_when_done() -> None:
            recorder.done.wait(args.timeout)
            svc.stop()

        threading.Thread(target=stop_when_done, daemon=True).start()
        started = time.monotonic()
        sys.setprofile(recorder)
        try:
            code = svc.run()
        finally:
            sys.setprofile(None)
        print(f"service exit code {code}, {time.monotonic() - started:.1f} s")
    if not recorder.done.is_set():
        print(f"no complete batch #{args.nth} within {args.timeout} s", file=sys.stderr)
        return 1

    calls, size = recorder.segment()
    print(f"batch #{args.nth}: {size} messages, {len(calls)} calls into stream_dedup")
    for label, kept in (
        ("all stream_dedup modules", calls),
        ("service level", [u for m in calls if (u := service_unit(m)) is not None]),
    ):
        seq = collapse(kept)
        distinct, returns = counts(seq)
        folded = fold(seq)
        loops_once = once(folded)
        f_distinct, f_returns = counts(loops_once)
        print(f"\n{label}: {distinct} distinct modules, {returns} returns ({len(seq)} steps)")
        print(
            f"  repetitions folded: {f_distinct} distinct, {f_returns} returns"
            f" ({len(loops_once)} steps)"
        )
        print("  " + show(folded))
        if args.full:
            print("  unfolded: " + " > ".join(m.removeprefix("stream_dedup.") for m in seq))
    return 0


if __name__ == "__main__":
    sys.exit(main())
