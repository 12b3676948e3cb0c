"""The payload dictionaries an index stores: each under its id, and the one in use.

A dictionary (:mod:`stream_dedup.core.payload_dictionary`) is the index's own record, in
no epoch: retention never drops it, since a held document's payload may name it. Records
name their dictionary by id, so every dictionary ever used stays stored (16 KiB each, one
per index unless instances of a shared index trained at the same time), and ``Z`` names
the one a deduplicator opening the index compresses with.
"""

from __future__ import annotations

from stream_dedup.core.payload_dictionary import dictionary_id
from stream_dedup.index import keys
from stream_dedup.index.backend import Backend

__all__ = ["PayloadDictionaries"]


class PayloadDictionaries:
    """Reads and writes of an index's payload dictionaries (mixed into the index)."""

    _backend: Backend

    def dictionary_bytes(self, ident: int) -> bytes | None:
        """The stored dictionary with id ``ident`` (``None``: not stored)."""
        return self._backend.get_many([keys.dictionary_key(ident)])[0]

    def payload_dictionary(self) -> bytes | None:
        """The dictionary new payloads are compressed with (``None``: none trained yet)."""
        used = self._backend.get_many([keys.DICTIONARY])[0]
        return None if used is None else self.dictionary_bytes(int.from_bytes(used, "little"))

    def claim_dictionary_training(self, ttl_ms: int) -> bool:
        """Whether this process is the one to train the dictionary (for ``ttl_ms``): on a
        shared index the first instance to ask (:meth:`~.backend.Backend.claim`), so that
        a group trains one (:mod:`stream_dedup.dedup.dictionary`)."""
        return self._backend.claim(keys.CLAIM + b"payload-dictionary", ttl_ms)

    def store_payload_dictionary(self, raw: bytes) -> None:
        """Store ``raw`` under its id and make it the one in use, in one atomic write:
        before any payload compressed with it is written, so no record names a dictionary
        the index lacks."""
        ident = dictionary_id(raw)
        self._backend.write(
            {keys.dictionary_key(ident): raw, keys.DICTIONARY: ident.to_bytes(4, "little")}
        )
