"""Sketching the next batch while the current one is decided: the one interface is
:class:`~stream_dedup.service.prefetch.ahead.SketchAhead`.

Inside: :mod:`.ahead` (what is sketched where, and when), :mod:`.worker` (the worker
process) and :mod:`.shared_memory` (the shared regions that carry records and sketches).
"""

from stream_dedup.service.prefetch.ahead import SketchAhead
from stream_dedup.service.prefetch.worker import SketchWorkerError

__all__ = ["SketchAhead", "SketchWorkerError"]
