"""Whether the compiled kernels every batch runs are in numba's cache yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stream_dedup.core import _containment_kernels, jit
from stream_dedup.core import containment as _containment
from stream_dedup.core import lookup_keys as _lookup_keys
from stream_dedup.core import match as _match

#: Said before the first batch when the compiled kernels are not in numba's cache yet.
COMPILING_NOTICE = (
    "compiling the detector's kernels (first run after install, up to ~15 s; "
    "later runs load them from the cache)"
)


def kernels_cached(containment: bool = False) -> bool:
    """Whether numba's on-disk cache holds the kernels that every batch runs.

    When it does not (the first run after an install or upgrade, or a cleared cache), the
    first batch compiles them, a long pause with nothing to show for it, which callers announce
    with :data:`COMPILING_NOTICE`. The check asks for the cache index (``*.nbi``) of the
    matching pass and of the key fingerprints, the two kernels every configuration runs,
    where numba's own locator puts it (``__pycache__`` beside the module, or under
    ``NUMBA_CACHE_DIR``): one ``stat`` each. With ``containment`` (the setting is on),
    the kernels that sample, vote for and verify excerpts too: they compile on the first batch
    that looks for one. Should numba's internals move, it answers
    True, as a missing notice costs less than a false one on every run. Asking imports
    numba: ask only before a batch that runs compiled (:func:`.compiling_notice`).
    """
    kernels: tuple[Any, ...] = (_match._match_batch, _lookup_keys._fingerprints)
    if containment:
        kernels += (
            _containment.intersections,
            _containment_kernels.count_votes,
            _containment_kernels.sample_flat,
        )
    for kernel in kernels:
        try:
            index = Path(jit.compiled(kernel)._cache._cache_file._index_path)
        except (AttributeError, TypeError):
            return True
        if not index.exists():
            return False
    return True


def compiling_notice(documents: int, containment: bool = False) -> str | None:
    """:data:`COMPILING_NOTICE` if a batch of ``documents`` documents is about to compile the
    kernels, else None.

    A batch that runs the Python forms (:func:`stream_dedup.core.jit.runs_compiled`)
    compiles nothing and is not asked about: asking would load numba, which it avoids.
    """
    if jit.runs_compiled(documents=documents) and not kernels_cached(containment):
        return COMPILING_NOTICE
    return None
