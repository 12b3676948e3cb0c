"""A batch's index-independent work: normalise, shingle, sign, band, digest.

Everything a decision needs from the documents themselves, computed for the whole batch at
once before the index is read. Character shingles (the default) take the compiled path of
:mod:`stream_dedup.core._kernels` when the batch is large enough to repay loading numba
(:func:`stream_dedup.core.jit.runs_compiled`): NFKC and ``casefold`` per text (C code in
the standard library), then one pass per document that collapses whitespace, one that
hashes the grams into the signature bins and their verification halves, numpy's sort per
document, and one pass that drops repeats. Word shingles, and a small batch of character
shingles, take the numpy path of :mod:`stream_dedup.core.shingles`. Both give exactly what
:func:`~stream_dedup.core.normalize.normalize`, :func:`~stream_dedup.core.shingles.
shingle_sets`, :func:`~stream_dedup.core.signature.signatures` and
:func:`~stream_dedup.core.verify.verification_sets` give, which the tests check.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream_dedup.core import _kernels as kernels
from stream_dedup.core import jit
from stream_dedup.core.bands import BandPlan, band_hashes
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.hashing import POLY, U32, U64
from stream_dedup.core.lookup_keys import (
    bucket_order,
    bucket_shared,
    content_digest,
    exact_key,
    fingerprints,
    packed_bucket_keys,
)
from stream_dedup.core.normalize import normalize
from stream_dedup.core.payload import encode_joined
from stream_dedup.core.payload_dictionary import Dictionary
from stream_dedup.core.shingles import char_gram_constants, shingle_sets
from stream_dedup.core.signature import SIG_DTYPE, densify, signatures
from stream_dedup.core.verify import verification_sets


@dataclass(frozen=True, slots=True)
class Sketch:
    """What the index lookups and the decisions of one batch need from its documents.

    ``size`` is the number of documents sketched and ``live`` the positions of those with
    non-empty normalised content; the other fields hold one entry per live document, in
    that order (``bucket_keys``: ``bands`` per document). The verification sets are one
    array, ``set_flat``, live document ``p``'s set at ``set_at[p]`` for ``set_len[p]``
    values (:attr:`sets` cuts them apart); they are empty unless verification is exact.
    ``bucket_order`` lists the positions in ``bucket_keys`` of its keys in ascending byte
    order (:func:`~.lookup_keys.bucket_order`), and
    ``bucket_shared`` the ``(position, first position)`` pairs of keys that occur more than
    once in the batch (:func:`~.lookup_keys.bucket_shared`). ``bucket_fingerprints`` are the bucket
    keys' fingerprints for the index's key filter
    (:func:`~stream_dedup.core.lookup_keys.fingerprints`), computed here, off the
    deciding process. ``payloads`` are the live documents' verification payloads, their
    normalised texts compressed (:mod:`~stream_dedup.core.payload`), which the index stores
    in place of the sets; empty unless verification is exact.
    """

    size: int
    live: list[int]
    set_flat: U32
    set_at: npt.NDArray[np.int64]
    set_len: npt.NDArray[np.int64]
    sigs: U32
    bucket_keys: list[bytes]
    exact_keys: list[bytes]
    bucket_order: npt.NDArray[np.intp]
    bucket_shared: npt.NDArray[np.intp]
    bucket_fingerprints: U64
    payloads: list[bytes]

    @property
    def sets(self) -> list[U32]:
        """Each live document's verification set (views of ``set_flat``)."""
        flat, at, length = self.set_flat, self.set_at.tolist(), self.set_len.tolist()
        return [flat[a : a + n] for a, n in zip(at, length, strict=True)]


#: Verification sets when verification is by signature: none.
_NO_SETS: tuple[U32, npt.NDArray[np.int64]] = (
    np.empty(0, dtype="<u4"),
    np.empty(0, dtype=np.int64),
)


#: Payloads when verification is by signature: none.
_NO_PAYLOADS: tuple[bytes, npt.NDArray[np.int64]] = (b"", np.empty(0, dtype=np.int64))


def sketch(
    texts: Sequence[str],
    config: DedupConfig,
    plan: BandPlan,
    dictionary: Dictionary | None = None,
    *,
    payloads: bool = True,
) -> Sketch:
    """The :class:`Sketch` of a batch of raw document contents; the payloads compressed
    with the index's ``dictionary``, if it has one (:mod:`.payload_dictionary`).
    ``payloads=False`` leaves them out (empty): a check stores nothing, so compressing
    its text (a few per cent of its sketch) would be work thrown away."""
    return unpack(sketch_packed(texts, config, plan, dictionary, payloads=payloads))


#: A :class:`Sketch` as plain values for a pipe: the verification sets as one array and
#: their sizes, the bucket keys as one array of fixed-width keys, the payloads as one
#: ``bytes`` and their sizes.
PackedSketch = tuple[
    int,
    list[int],
    U32,
    npt.NDArray[np.int64],
    U32,
    npt.NDArray[np.void],
    list[bytes],
    npt.NDArray[np.intp],
    npt.NDArray[np.intp],
    U64,
    bytes,
    npt.NDArray[np.int64],
]


def sketch_packed(
    texts: Sequence[str],
    config: DedupConfig,
    plan: BandPlan,
    dictionary: Dictionary | None = None,
    *,
    payloads: bool = True,
) -> PackedSketch:
    """:func:`sketch` as the plain values the sketch worker sends (see :func:`unpack`).

    A few large arrays pickle and unpickle at memory speed, where a batch's ~36,000 bucket
    keys as ``bytes`` objects cost an object each to pickle and to build again, and its
    verification sets as 2,000 arrays cost a copy to join them: the worker sends these,
    and only the process that decides turns them into the objects it uses.
    """
    if config.shingle.kind == "char" and jit.runs_compiled(documents=len(texts)):
        live, flat, sizes, sigs, digests, texts_at = _sketch_char(texts, config)
    else:
        live, flat, sizes, sigs, digests, texts_at = _sketch_numpy(texts, config)
    joined, lens = (
        encode_joined(*texts_at, dictionary)
        if payloads and config.verify == "exact"
        else _NO_PAYLOADS
    )
    hashes = band_hashes(sigs, plan, config.seed)
    order = bucket_order(hashes)
    return (
        len(texts),
        live,
        flat,
        sizes,
        sigs,
        packed_bucket_keys(hashes),
        [exact_key(d) for d in digests],
        order,
        bucket_shared(hashes, order),
        fingerprints(
            np.tile(np.arange(plan.bands, dtype=np.uint16), hashes.shape[0]), hashes.reshape(-1)
        ),
        joined,
        lens,
    )


def unpack(packed: PackedSketch) -> Sketch:
    """The :class:`Sketch` whose plain values :func:`sketch_packed` computed."""
    size, live, flat, sizes, sigs, bucket_keys, exact_keys, order, shared, fps, joined, lens = (
        packed
    )
    at = np.cumsum(sizes) - sizes
    keys_list: list[bytes] = bucket_keys.tolist()  # see lookup_keys.PACKED_BUCKET_KEY
    ends = np.cumsum(lens).tolist()
    payloads = [joined[e - n : e] for e, n in zip(ends, lens.tolist(), strict=True)]
    return Sketch(
        size, live, flat, at, sizes, sigs, keys_list, exact_keys, order, shared, fps, payloads
    )


#: What each sketch path returns: live positions, sets and their sizes, signatures,
#: exact-text digests, and the live documents' normalised UTF-8 as ``(bytes, starts,
#: lengths)`` for their payloads.
_Parts = tuple[
    list[int], U32, npt.NDArray[np.int64], U32, list[bytes], tuple[bytes, list[int], list[int]]
]


def _sketch_char(texts: Sequence[str], config: DedupConfig) -> _Parts:
    k = config.shingle.k
    folded = [unicodedata.normalize("NFKC", t).casefold() for t in texts]
    raw = np.frombuffer("".join(folded).encode("utf-32-le", "surrogatepass"), dtype="<u4")
    lengths = np.fromiter((len(t) for t in folded), dtype=np.int64, count=len(folded))
    starts = np.cumsum(lengths) - lengths
    units, lengths, utf8, utf8_lengths = jit.compiled(kernels.collapse_whitespace)(
        raw, starts, lengths, kernels.WHITESPACE, k - 1
    )
    starts = np.cumsum(lengths) - lengths
    utf8_starts = np.cumsum(utf8_lengths) - utf8_lengths
    live_at = np.flatnonzero(lengths > 0)
    starts, lengths = starts[live_at], lengths[live_at]
    n = live_at.size
    sigs = np.zeros((n, config.num_perm), dtype=SIG_DTYPE)
    filled = np.zeros((n, config.num_perm), dtype=bool)
    counts = np.where(lengths >= k, lengths - k + 1, 1)
    high = np.empty(int(counts.sum()), dtype="<u4")
    seed_mix, bias = char_gram_constants(k, config.seed)
    runs = jit.compiled(kernels.sketch_grams)(
        units, starts, lengths, k, POLY, bias, seed_mix, sigs, filled, high,
    )  # fmt: skip
    if not filled.all():
        densify(sigs, filled, config.num_perm, config.seed)
    flat, sizes = _NO_SETS
    if config.verify == "exact":
        bounds = runs.tolist()
        for lo, hi in itertools.pairwise(bounds):
            high[lo:hi].sort()
        flat, sizes = jit.compiled(kernels.drop_repeats)(high, runs)
    text = utf8.tobytes()
    at8, len8 = utf8_starts[live_at].tolist(), utf8_lengths[live_at].tolist()
    digests = [content_digest(text[s : s + c]) for s, c in zip(at8, len8, strict=True)]
    return live_at.tolist(), flat, sizes, sigs, digests, (text, at8, len8)


def _sketch_numpy(texts: Sequence[str], config: DedupConfig) -> _Parts:
    norms = [normalize(t) for t in texts]
    live = [i for i, t in enumerate(norms) if t]
    batch = shingle_sets([norms[i] for i in live], config.shingle, config.seed)
    sigs = signatures(batch, config.num_perm, config.seed)
    flat, sizes = _NO_SETS
    if config.verify == "exact":
        sets = verification_sets(batch)
        sizes = np.fromiter((a.size for a in sets), dtype=np.int64, count=len(sets))
        flat = np.concatenate(sets) if sets else flat
    utf8 = [norms[i].encode("utf-8", "surrogatepass") for i in live]
    digests = [content_digest(t) for t in utf8]
    lengths = [len(t) for t in utf8]
    starts = list(itertools.accumulate(lengths, initial=0))[:-1]
    return live, flat, sizes, sigs, digests, (b"".join(utf8), starts, lengths)
