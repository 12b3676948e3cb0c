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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream_dedup.core import payload_dictionary
from stream_dedup.core.payload import decode_text
from stream_dedup.core.payload_dictionary import TRAIN_DOCUMENTS, Dictionary
from stream_dedup.core.sketch import Sketch

if TYPE_CHECKING:
    from stream_dedup.index.store import DedupIndex

__all__ = ["DictionaryTrainer"]


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

    def gather(self, sk: Sketch) -> None:
        """Keep the texts of a decided batch's payloads until there are enough, then train
        a dictionary, store it in the index and use it from the next sketch on.

        Another instance of a shared index may have stored one meanwhile: that one is
        taken instead, so instances usually share one (if two train at once, each keeps
        its own; both are stored and read).
        """
        if self.dictionary is not None or not self.train_documents:
            return
        self._texts.extend(decode_text(p) for p in sk.payloads)
        if len(self._texts) < self.train_documents:
            return
        # The first documents exactly, whatever the batches: the same stream trains the
        # same dictionary.
        texts, self._texts = self._texts[: self.train_documents], []
        stored = self._index.payload_dictionary()
        if stored is not None:
            self.dictionary = payload_dictionary.known(stored)
            return
        trained = payload_dictionary.train(texts)
        if trained is None:  # too little text to learn from: compress without one
            self.train_documents = 0
            return
        self._index.store_payload_dictionary(trained.raw)
        self.dictionary = trained
