"""Whether the compiled kernels every batch runs are in numba's cache yet."""

from __future__ import annotations

from pathlib import Path

from stream_dedup.core import lookup_keys as _lookup_keys
from stream_dedup.core import match as _match

#: Said before the first batch when the compiled kernels are not in numba's cache yet.
COMPILING_NOTICE = (
    "compiling the detector's kernels (first run after install, up to ~15 s; "
    "later runs load them from the cache)"
)


def kernels_cached() -> bool:
    """Whether numba's on-disk cache holds the kernels that every batch runs.

    When it does not (the first run after an install or upgrade, or a cleared cache), the
    first batch compiles them, a long pause with nothing to show for it, which callers announce
    with :data:`COMPILING_NOTICE`. The check asks for the cache index (``*.nbi``) of the
    matching pass and of the key fingerprints, the two kernels every configuration runs,
    where numba's own locator puts it (``__pycache__`` beside the module, or under
    ``NUMBA_CACHE_DIR``): one ``stat`` each. Should numba's internals move, it answers
    True, as a missing notice costs less than a false one on every run.
    """
    for kernel in (_match._match_batch, _lookup_keys._fingerprints):
        try:
            index = Path(kernel._cache._cache_file._index_path)
        except (AttributeError, TypeError):
            return True
        if not index.exists():
            return False
    return True
