"""The payload dictionary a deduplicator compresses with: the index's, or one it trains.

An index without a dictionary (a new one, or one of format 5 or older) gets one from the
texts of the first :data:`~stream_dedup.core.payload_dictionary.TRAIN_DOCUMENTS` documents
decided into it: those are compressed without a dictionary, every later one with it (both
read back alike: the payload names its codec). The dictionary is stored in the index
before any payload made with it is written (:mod:`stream_dedup.index.dictionaries`), so
every process that reads the index finds it: the service's sketch worker is handed it
(:class:`~stream_dedup.service.prefetch.worker.SketchWorker`), other readers load it by
the id their records name. Verdicts do not depend on it: a set is rebuilt from the text,
whatever compressed it.

**On a shared index one instance trains it, off its deciding thread.** The instances of
a group started together reach the sample size at about the same batch; each training
its own cost each ~0.3 s of CPU on the deciding thread, the group's time order made the
others wait for it, and the index kept one dictionary per instance. So the first to
reach the sample size claims the training (expiring after :data:`CLAIM_TTL_MS`; see
:meth:`~stream_dedup.index.dictionaries.PayloadDictionaries.claim_dictionary_training`)
and trains on a thread of its own (zstd's trainer
lets go of the GIL): it stores the dictionary at its first batch after the training ends.
The others look for the stored one at most once per :data:`LOOK_EVERY_S` and compress
without one meanwhile; if the claim expires with nothing stored (its holder died), the
next to look claims it and trains on its own sample. A store one process writes trains at
once, on the deciding thread: an offline run then switches to the dictionary at the same
batch every time.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from stream_dedup.core import payload_dictionary
from stream_dedup.core.payload import decode_text
from stream_dedup.core.payload_dictionary import TRAIN_DOCUMENTS, Dictionary
from stream_dedup.core.sketch import Sketch

if TYPE_CHECKING:
    from stream_dedup.index.store import DedupIndex

__all__ = ["CLAIM_TTL_MS", "LOOK_EVERY_S", "DictionaryTrainer"]

#: How long a claim to train the dictionary holds: a training takes well under a second,
#: so an expired claim means its holder died (or stalled), and another instance trains.
CLAIM_TTL_MS = 30_000
#: How often an instance waiting for another's dictionary looks for it in the index.
LOOK_EVERY_S = 0.25


class DictionaryTrainer:
    """Holds the dictionary new payloads use, and the texts gathered to train one."""

    def __init__(self, index: DedupIndex, exact: bool) -> None:
        """``exact``: payloads hold texts (``verify = "exact"``); otherwise none is used."""
        self._index = index
        raw = index.payload_dictionary() if exact else None
        #: The dictionary the sketch compresses with (``None``: without one).
        self.dictionary: Dictionary | None = (
            payload_dictionary.known(raw) if raw is not None else None
        )
        #: Documents to gather before training (0: never train; tests set fewer).
        self.train_documents = TRAIN_DOCUMENTS if exact else 0
        self._texts: list[str] = []
        #: The sample, once gathered, kept until a dictionary is in use.
        self._sample: list[str] | None = None
        #: A training on its own thread (shared index), and what it gave.
        self._training: threading.Thread | None = None
        self._trained: list[Dictionary | None] = []
        #: When to look for another instance's dictionary next (monotonic seconds).
        self._look_at = 0.0
        #: Dictionaries this trainer trained, and those it took from the index, since it
        #: was made (a group of instances trains one).
        self.trained = 0
        self.adopted = 0

    @property
    def training(self) -> bool:
        """Whether a training runs on its own thread now."""
        return self._training is not None

    def gather(self, sk: Sketch) -> None:
        """Keep the texts of a decided batch's payloads until there are enough, then get a
        dictionary (stored by another instance, or trained: here on an index this process
        alone writes, on a thread of its own on a shared one, see the module docstring),
        store it in the index and use it from the next sketch on."""
        if self.dictionary is not None or not self.train_documents:
            return
        if self._sample is None:
            self._texts.extend(decode_text(p) for p in sk.payloads)
            if len(self._texts) < self.train_documents:
                return
            # The first documents exactly, whatever the batches: the same stream trains
            # the same dictionary.
            self._sample, self._texts = self._texts[: self.train_documents], []
        if self._training is not None:
            if not self._training.is_alive():
                self.wait()
            return
        if time.monotonic() < self._look_at:
            return
        stored = self._index.payload_dictionary()
        if stored is not None:
            self._use(payload_dictionary.known(stored), trained=False)
        elif not self._index.shared:
            self._use(payload_dictionary.train(self._sample), trained=True)
        elif self._index.claim_dictionary_training(CLAIM_TTL_MS):
            sample = self._sample
            self._training = threading.Thread(
                target=lambda: self._trained.append(payload_dictionary.train(sample)),
                name="payload-dictionary",
                daemon=True,
            )
            self._training.start()
        else:  # another instance trains it
            self._look_at = time.monotonic() + LOOK_EVERY_S

    def wait(self) -> None:
        """Let a training on its own thread finish, and use what it gave (tests, and a
        caller that wants the dictionary now)."""
        if self._training is not None:
            self._training.join()
            self._training = None
            # nothing given: the thread failed (logged by threading); compress without one
            self._use(self._trained.pop() if self._trained else None, trained=True)

    def _use(self, found: Dictionary | None, *, trained: bool) -> None:
        """Use ``found`` from the next sketch on, storing it first when trained here
        (``None``: too little text to learn from, compress without one)."""
        self._sample = None
        if found is None:
            self.train_documents = 0
            return
        if trained:
            self._index.store_payload_dictionary(found.raw)
            self.trained += 1
        else:
            self.adopted += 1
        self.dictionary = found
