"""Trained zstd dictionaries for the verification payload: made, named, found again.

A news article or an ad is too short for zstd to learn its language from the text alone:
most of a ~1.2 KB frame spells out words and phrases every other document repeats. A
dictionary trained on an index's own first documents holds them once, and each frame then
refers to it: 602 -> 390 bytes per generated news article, 422 -> 226 per Kijiji ad, at the
same compression and decompression cost (level 1, ~10 and ~5 µs). A generic dictionary
does not do this: one trained on English prose made the news frames *larger* (630), so
each index trains its own (:meth:`~stream_dedup.dedup.Deduplicator.decide` gathers the
texts of its first documents).

**Naming.** A dictionary's id is the first 32 bits of the BLAKE2b digest of its bytes, so
an id names one dictionary whatever process trained it: two instances of a shared index
that train at the same time store two dictionaries under two ids, and records name the one
they were compressed with (payload codec 3, :mod:`.payload`). The index stores each under
its id (:mod:`stream_dedup.index.dictionaries`); a process meets a record of a dictionary it
has not loaded (written by another instance, or before it started) and finds it through
the *sources* registered here: one per open index, held weakly. This module is pure: it
knows sources as functions from an id to bytes, not the index behind them.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Sequence

import zstandard

from stream_dedup.errors import IndexCorruptError, StreamDedupError

__all__ = [
    "DICTIONARY_BYTES", "TRAIN_DOCUMENTS", "Dictionary", "add_source", "dictionary_id",
    "find_dictionary", "train",
]  # fmt: skip

#: Bytes of a trained dictionary: 64 KiB gave 393 bytes per news article against 390 at 16.
DICTIONARY_BYTES = 16 << 10
#: Documents whose texts a dictionary is trained on: one batch of the service's default
#: size; ~0.5 s of CPU, once per index.
TRAIN_DOCUMENTS = 2000
#: Fewer sample bytes than this train no dictionary (zstd needs ~100 samples' worth).
_MIN_SAMPLE_BYTES = 64 << 10
#: The level and the input size the parameters are chosen for: as without a dictionary.
_LEVEL = 1
_TYPICAL_TEXT = 16 << 10
_CODEC = 3


def dictionary_id(raw: bytes) -> int:
    """The id of the dictionary ``raw``: its BLAKE2b digest's first 32 bits."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=4).digest(), "little")


class Dictionary:
    """A trained dictionary and the codecs that use it (one of each per thread)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.id = dictionary_id(raw)
        #: What a payload compressed with it starts with: codec byte and id.
        self.header = bytes([_CODEC]) + self.id.to_bytes(4, "little")
        self._data = zstandard.ZstdCompressionDict(raw)
        self._params = zstandard.ZstdCompressionParameters.from_level(
            _LEVEL,
            source_size=_TYPICAL_TEXT,
            format=zstandard.FORMAT_ZSTD1_MAGICLESS,
            write_checksum=0,
            write_dict_id=0,  # the id is in the header, once
        )
        self._data.precompute_compress(compression_params=self._params)
        self._local = threading.local()  # a zstd context is not safe in two threads

    def compressor(self) -> zstandard.ZstdCompressor:
        """This thread's compressor with the dictionary."""
        codec: zstandard.ZstdCompressor | None = getattr(self._local, "compressor", None)
        if codec is None:
            codec = zstandard.ZstdCompressor(compression_params=self._params, dict_data=self._data)
            self._local.compressor = codec
        return codec

    def decompressor(self) -> zstandard.ZstdDecompressor:
        """This thread's decompressor with the dictionary."""
        codec: zstandard.ZstdDecompressor | None = getattr(self._local, "decompressor", None)
        if codec is None:
            codec = zstandard.ZstdDecompressor(
                dict_data=self._data, format=zstandard.FORMAT_ZSTD1_MAGICLESS
            )
            self._local.decompressor = codec
        return codec


def train(texts: Sequence[str]) -> Dictionary | None:
    """A dictionary trained on normalised ``texts`` (``None`` if too little text for one).

    Known at once to this process (:func:`find_dictionary`): the caller stores it in its
    index before any payload made with it is written.
    """
    samples: list[bytes | bytearray | memoryview] = [
        t.encode("utf-8", "surrogatepass") for t in texts
    ]
    if sum(map(len, samples)) < _MIN_SAMPLE_BYTES:
        return None
    try:
        trained = zstandard.train_dictionary(DICTIONARY_BYTES, samples, level=3)
    except zstandard.ZstdError:  # too few or too uniform samples for a dictionary
        return None
    return known(trained.as_bytes())


_lock = threading.Lock()
_known: dict[int, Dictionary] = {}
_sources: list[weakref.WeakMethod[Callable[[int], bytes | None]]] = []


def known(raw: bytes) -> Dictionary:
    """The :class:`Dictionary` of ``raw``, made once per process."""
    ident = dictionary_id(raw)
    with _lock:
        found = _known.get(ident)
        if found is None:
            found = _known[ident] = Dictionary(raw)
    return found


def add_source(source: Callable[[int], bytes | None]) -> None:
    """Let :func:`find_dictionary` ask ``source`` (a bound method: held weakly, so an index
    that is closed and dropped is not kept alive) for dictionaries not yet loaded."""
    with _lock:
        _sources[:] = [s for s in _sources if s() is not None]
        _sources.append(weakref.WeakMethod(source))


def find_dictionary(ident: int) -> Dictionary:
    """The dictionary with id ``ident``: loaded already, or from the first source that
    holds it; :class:`~stream_dedup.errors.IndexCorruptError` if none does."""
    found = _known.get(ident)
    if found is not None:
        return found
    with _lock:
        sources = [s for s in (ref() for ref in _sources) if s is not None]
    for source in sources:
        try:
            raw = source(ident)
        except StreamDedupError:  # a closed index, say: ask the next one
            continue
        if raw is not None and dictionary_id(raw) == ident:
            return known(raw)
    raise IndexCorruptError(f"verification payload names dictionary {ident:#010x}, not stored")
