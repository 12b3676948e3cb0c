"""The verification payload: a document's normalised text, compressed, and its
verification set rebuilt from it when the document becomes a candidate.

Exact verification compares verification sets (:mod:`stream_dedup.core.verify`), 4 bytes
per distinct shingle: about 4 bytes per character of text, most of an index's bytes. The
normalised text they are computed from is a quarter of that, and compresses to about half
again. So an indexed document stores its normalised text (the very code points the
sketch hashed, as UTF-8 with lone surrogates kept, ``surrogatepass``) as one zstd frame,
and a candidate's set is computed again from it by the same compiled kernel that computed
it the first time: the set, and so every verdict, is bit for bit the one a stored set
gives. The text also serves any later comparison a set cannot (containment of a shingle
sequence, say), since everything a set holds is a function of it.

Payload bytes: ``u8 codec | body``; :data:`ZSTD` (1, index format 4) is a zstd frame
without a dictionary, its content size in the frame header; :data:`ZSTD_MAGICLESS` (2,
written from format 5) the same frame without zstd's 4-byte magic number, which the
codec byte already says (4 bytes of ~640 per news document, on every backend);
:data:`ZSTD_DICTIONARY` (3, format 6) ``u32 LE dictionary id | magicless frame``, the
frame compressed with a dictionary trained on the index's own first documents
(:mod:`.payload_dictionary`): a third less again on news, half on short ads. Other codec
values are reserved, so a reader meeting one it does not know fails loudly instead of
misreading it.

Rebuilding costs a decompression (a few microseconds) and the hashing and sort a sketch
does: :class:`~stream_dedup.core.set_cache.SetCache` keeps the sets of recent candidates
and of the documents just indexed (re-runs of a story arrive close together), keyed by the
payload bytes themselves, so no entry can go stale whatever writes the index.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zstandard

from stream_dedup.core import _kernels as kernels
from stream_dedup.core import _rebuild_kernels as rebuild_kernels
from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.hashing import POLY, U32
from stream_dedup.core.shingles import I64, ShingleSpec, char_gram_constants, shingle_sets
from stream_dedup.core.verify import verification_sets
from stream_dedup.errors import IndexCorruptError

if TYPE_CHECKING:
    from stream_dedup.core.payload_dictionary import Dictionary

#: Codec byte of a zstd frame without a dictionary (index format 4; read, not written).
ZSTD = 1
#: Codec byte of a zstd frame without a dictionary or magic number (written).
ZSTD_MAGICLESS = 2
#: Codec byte of a zstd frame without magic number, made with a trained dictionary whose
#: id follows the codec byte (``u32`` little-endian; format 6).
ZSTD_DICTIONARY = 3
#: zstd's level: levels 1 to 9 give the same size on news within 1% (609 bytes at 1, 611
#: at 3 for 1,155 characters), and level 1 compresses fastest (~11 against ~15 µs).
_LEVEL = 1
_CODEC = bytes([ZSTD_MAGICLESS])
#: The input size zstd's parameters are chosen for (see :class:`_Codecs`).
_TYPICAL_TEXT = 16 << 10


class _Codecs(threading.local):
    """A zstd compressor and decompressor per thread: one object is not safe to use from
    two threads at once, and checks run beside the deciding loop (``Detector.check``)."""

    def __init__(self) -> None:
        # Fixed parameters are not fitted to each input's size as a level alone is: those
        # zstd picks for inputs up to 16 KB (a news article is ~1.2 KB) give format 4's
        # frames less their magic number (604 against 608 bytes on news); 617 without.
        params = zstandard.ZstdCompressionParameters.from_level(
            _LEVEL,
            source_size=_TYPICAL_TEXT,
            format=zstandard.FORMAT_ZSTD1_MAGICLESS,
            write_checksum=0,
        )
        self.compressor = zstandard.ZstdCompressor(compression_params=params)
        self.decompressors = {
            ZSTD: zstandard.ZstdDecompressor(),
            ZSTD_MAGICLESS: zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS),
        }


_codecs = _Codecs()
#: The zstd frame format of each codec, to read a frame's header.
_FRAME_FORMATS = {
    ZSTD: zstandard.FORMAT_ZSTD1,
    ZSTD_MAGICLESS: zstandard.FORMAT_ZSTD1_MAGICLESS,
    ZSTD_DICTIONARY: zstandard.FORMAT_ZSTD1_MAGICLESS,
}


def encode_texts(
    utf8: bytes,
    starts: Sequence[int],
    lengths: Sequence[int],
    dictionary: Dictionary | None = None,
) -> list[bytes]:
    """The payload of each normalised text ``utf8[starts[i] : starts[i] + lengths[i]]``,
    compressed with ``dictionary`` when given (the index's; see :mod:`.payload_dictionary`)."""
    if dictionary is not None:
        head, compress = dictionary.header, dictionary.compressor().compress
    else:
        head, compress = _CODEC, _codecs.compressor.compress
    return [head + compress(utf8[s : s + n]) for s, n in zip(starts, lengths, strict=True)]


def encode_joined(
    utf8: bytes,
    starts: Sequence[int],
    lengths: Sequence[int],
    dictionary: Dictionary | None = None,
) -> tuple[bytes, I64]:
    """:func:`encode_texts`'s payloads end to end, and each one's size: what a sketch
    carries (byte for byte the same payloads).

    One call compresses the batch (zstd's ``multi_compress_to_buffer`` over segments of
    ``utf8``, in this thread), so what a ``compress`` per ~1 KB text paid around zstd's
    own work (a ``bytes`` per slice of input, an output ``bytes`` allocated for the worst
    case and cut down, the interpreter's call) is not paid per text: timed alone ~1.5-5
    µs of a news article's ~9-14, and the service's sketch worker went from 73 to 66.5 µs
    of CPU per document (medians, docs/benchmarks.md, 2026-11-26).
    """
    n = len(starts)
    if n == 0:
        return b"", np.empty(0, dtype=np.int64)
    if dictionary is not None:
        head, compressor = dictionary.header, dictionary.compressor()
    else:
        head, compressor = _CODEC, _codecs.compressor
    segments = np.empty((n, 2), dtype=np.uint64)
    segments[:, 0] = starts
    segments[:, 1] = lengths
    frames = compressor.multi_compress_to_buffer(
        zstandard.BufferWithSegments(utf8, segments.tobytes()), threads=0
    )
    parts = [frames[i] for i in range(n)]
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=n) + len(head)
    pieces: list[Any] = [head] * (2 * n)  # the header, then the frame (a buffer), each
    pieces[1::2] = parts
    return b"".join(pieces), sizes


def decode_text(payload: bytes) -> str:
    """The normalised text a payload holds."""
    return decode_utf8(payload).decode("utf-8", "surrogatepass")


def decode_utf8(payload: bytes) -> bytes:
    """The normalised text a payload holds, as the UTF-8 bytes it was compressed from."""
    codec = payload[0] if payload else None
    body = payload[1:]
    decompressor: zstandard.ZstdDecompressor | None
    if codec == ZSTD_DICTIONARY:
        from stream_dedup.core.payload_dictionary import find_dictionary

        decompressor = find_dictionary(int.from_bytes(body[:4], "little")).decompressor()
        body = body[4:]
    else:
        decompressor = _codecs.decompressors.get(codec) if codec is not None else None
    if decompressor is None:
        raise IndexCorruptError(f"unknown verification payload codec {codec!r}")
    try:
        return decompressor.decompress(body)
    except zstandard.ZstdError as exc:
        raise IndexCorruptError(f"verification payload does not decompress: {exc}") from exc


def set_size_bounds(payloads: Sequence[bytes], shingle: ShingleSpec) -> I64:
    """The most distinct shingles each payload's text can have, from its zstd frame header
    alone (no decompression): its UTF-8 byte count bounds its code points, and so its
    shingles. What :mod:`stream_dedup.dedup.prune` rules candidates out with; a frame
    that does not state its content size (none written here) gets no bound."""
    unknown = np.iinfo(np.int64).max
    sizes = np.empty(len(payloads), dtype=np.int64)
    params = zstandard.get_frame_parameters
    for i, payload in enumerate(payloads):
        frame_format = _FRAME_FORMATS.get(payload[0]) if payload else None
        if frame_format is None:
            codec = payload[0] if payload else None
            raise IndexCorruptError(f"unknown verification payload codec {codec!r}")
        # a dictionary's frame follows its id (u32)
        frame = payload[5:] if payload[0] == ZSTD_DICTIONARY else payload[1:]
        try:
            size = params(frame, format=frame_format).content_size
        except zstandard.ZstdError as exc:
            raise IndexCorruptError(f"verification payload has no frame header: {exc}") from exc
        sizes[i] = unknown if size == zstandard.CONTENTSIZE_UNKNOWN else size
    known = sizes != unknown
    # char k-grams: n - k + 1 of n >= k code points, else 1; word k-grams: at most one per
    # space-separated word, and a text of L bytes splits into at most L + 1 of them.
    if shingle.kind == "char":
        sizes[known] = np.maximum(sizes[known] - shingle.k + 1, 1)
    else:
        sizes[known] += 1
    return sizes


def rebuild_sets(texts: Sequence[str], config: DedupConfig) -> list[U32]:
    """The verification sets of normalised texts: what the sketch computed for them.

    Character shingles take the compiled kernel the sketch uses
    (:func:`~stream_dedup.core._kernels.sketch_grams`: its signature output is discarded),
    then numpy's sort and the repeat-dropping pass, when the sketch would (see
    :func:`~stream_dedup.core.jit.runs_compiled`); otherwise, and for word shingles, the
    numpy reference, which gives the same sets.
    """
    flat, sizes = rebuild_flat(texts, config)
    ends = np.cumsum(sizes).tolist()
    return [flat[e - s : e] for e, s in zip(ends, sizes.tolist(), strict=True)]


def payload_sets(payloads: Sequence[bytes], config: DedupConfig) -> tuple[U32, I64]:
    """The verification sets of the texts ``payloads`` hold, as :func:`rebuild_flat` gives
    them (end to end, and each one's size).

    When the sketch would run compiled, character shingles are hashed straight from the
    decompressed UTF-8 by :func:`~stream_dedup.core._rebuild_kernels.text_gram_highs`
    (no ``str`` made, no signature bins filled), then sorted by numpy and their repeats
    dropped: ~half the CPU of decoding the texts and running the sketch's kernel.
    """
    raws = [decode_utf8(p) for p in payloads]
    if config.shingle.kind != "char" or not jit.runs_compiled(documents=len(raws)):
        return rebuild_flat([r.decode("utf-8", "surrogatepass") for r in raws], config)
    utf8 = np.frombuffer(b"".join(raws), dtype=np.uint8)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    seed_mix, bias = char_gram_constants(config.shingle.k, config.seed)
    high, runs = jit.compiled(rebuild_kernels.text_gram_highs)(
        utf8, np.cumsum(lengths) - lengths, lengths, config.shingle.k, POLY, bias, seed_mix
    )
    for lo, hi in itertools.pairwise(runs.tolist()):
        high[lo:hi].sort()
    flat, sizes = jit.compiled(kernels.drop_repeats)(high, runs)
    return flat, sizes.astype(np.int64, copy=False)


def rebuild_flat(texts: Sequence[str], config: DedupConfig) -> tuple[U32, I64]:
    """:func:`rebuild_sets` as one array of the sets end to end and each set's size: what
    :class:`~stream_dedup.core.set_cache.SetCache` keeps, with no array per set."""
    if config.shingle.kind != "char" or not jit.runs_compiled(documents=len(texts)):
        sets = verification_sets(shingle_sets(texts, config.shingle, config.seed))
        sizes = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
        return (np.concatenate(sets) if sets else np.empty(0, "<u4")), sizes
    k = config.shingle.k
    units = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype="<u4")
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.cumsum(lengths) - lengths
    n = len(texts)
    counts = np.where(lengths >= k, lengths - k + 1, 1)
    high = np.empty(int(counts.sum()), dtype="<u4")
    seed_mix, bias = char_gram_constants(k, config.seed)
    sigs = np.zeros((n, config.num_perm), dtype=np.uint32)
    filled = np.zeros((n, config.num_perm), dtype=bool)
    runs = jit.compiled(kernels.sketch_grams)(
        units, starts, lengths, k, POLY, bias, seed_mix, sigs, filled, high,
    )  # fmt: skip
    for lo, hi in itertools.pairwise(runs.tolist()):
        high[lo:hi].sort()
    flat, sizes = jit.compiled(kernels.drop_repeats)(high, runs)
    return flat, sizes.astype(np.int64, copy=False)
