"""The key filters of an index's live epochs: built, saved, loaded and dropped together.

Each epoch (:mod:`stream_dedup.index.retention`) has a :class:`~.filter.KeyFilter` of its
own, so that the filter of an expired epoch goes with it and a lookup reads only the
epochs that may hold a key. A writer that closes the index saves them beside it, each
stamped with the index's write sequence number (epoch 0's file keeps the name it had
before epochs existed); the next opening loads a file only at the same number and builds
the rest from a scan of that epoch's lookup keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from itertools import islice

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U64
from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.filter import KeyFilter, bucket_fingerprints, key_fingerprints

log = logging.getLogger("stream_dedup.index")

#: Keys fingerprinted at a time while a key filter is built.
_FILTER_CHUNK = 1 << 18
#: Epoch 0's filter file beside a RocksDB index (see :func:`filter_file`).
FILTER_FILE = "keyfilter.bin"
#: Keys read through the key filter besides the band buckets: verdicts and exact texts.
LOOKUP_KINDS = frozenset({keys.VERDICT, keys.EXACT})


def filter_file(epoch: int) -> str:
    """The name of epoch ``epoch``'s saved filter."""
    return FILTER_FILE if epoch == 0 else f"keyfilter-epoch-{epoch}.bin"


class EpochFilters:
    """One key filter per live epoch of one index."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._filters: dict[int, KeyFilter] = {}

    @property
    def loaded(self) -> bool:
        return bool(self._filters)

    def load(
        self, capacities: Mapping[int, int], progress: Callable[[int], None] | None = None
    ) -> None:
        """Load or build the filter of every epoch in ``capacities`` (epoch -> keys it may
        hold, the size a built filter gets); ``progress`` gets the keys added so far."""
        started = time.perf_counter()
        built = loaded = 0
        added = 0
        for epoch, capacity in capacities.items():
            saved = self._load_saved(epoch)
            if saved is not None:
                self._filters[epoch] = saved
                loaded += 1
                continue
            filt = KeyFilter(capacity)
            for kind in (keys.BUCKET, *sorted(LOOKUP_KINDS)):
                fingerprint = bucket_fingerprints if kind == keys.BUCKET else key_fingerprints
                scan = self._backend.scan_keys(kind, epoch)
                while chunk := list(islice(scan, _FILTER_CHUNK)):
                    filt.add(fingerprint(chunk))
                    if progress is not None:
                        progress(added + filt.count)
            added += filt.count
            self._filters[epoch] = filt
            built += filt.count > 0
        if loaded or built:
            fields = {
                "epochs": len(self._filters),
                "loaded": loaded,
                "built": built,
                "keys": sum(f.count for f in self._filters.values()),
                "bytes": self.nbytes,
                "seconds": round(time.perf_counter() - started, 3),
            }
            message = "key filter built from the index" if built else "key filter loaded"
            log.info(message, extra={"fields": fields})
        # Files of epochs no longer live would never be read again.
        for epoch in self._backend.epochs():
            if epoch not in capacities:
                self._unlink(epoch)

    def _load_saved(self, epoch: int) -> KeyFilter | None:
        """The filter saved for ``epoch`` if it describes the index as it is; the file is
        removed either way (from now on it would describe an index that has moved on)."""
        path = self._backend.sidecar(filter_file(epoch))
        if path is None or not path.exists():
            return None
        try:
            return KeyFilter.load(path, self._backend.sequence())
        except (OSError, ValueError) as exc:
            log.info(
                "saved key filter not used; building it from the index",
                extra={"fields": {"file": str(path), "reason": str(exc)}},
            )
            return None
        finally:
            path.unlink(missing_ok=True)

    def _unlink(self, epoch: int) -> None:
        path = self._backend.sidecar(filter_file(epoch))
        if path is not None:
            path.unlink(missing_ok=True)

    def save(self) -> None:
        """Save every filter for the next opening (nothing for an index in memory)."""
        started = time.perf_counter()
        stamp = self._backend.sequence()
        for epoch, filt in self._filters.items():
            path = self._backend.sidecar(filter_file(epoch))
            if path is None:
                return
            try:
                filt.save(path, stamp)
            except OSError as exc:
                log.warning(
                    "could not save a key filter; the next start builds it from the index",
                    extra={"fields": {"file": str(path), "error": str(exc)}},
                )
                return
        if self._filters and self._backend.sidecar(FILTER_FILE) is not None:
            fields = {
                "epochs": len(self._filters),
                "bytes": self.nbytes,
                "seconds": round(time.perf_counter() - started, 3),
            }
            log.info("key filter saved", extra={"fields": fields})

    def may_hold(self, epoch: int, fps: U64) -> npt.NDArray[np.bool_]:
        """Where epoch ``epoch`` may hold the keys of fingerprints ``fps``."""
        filt = self._filters.get(epoch)
        if filt is None:
            return np.zeros(fps.size, dtype=np.bool_)
        return filt.may_hold(fps)

    def add(self, epoch: int, fps: U64, capacity: int) -> None:
        """Add the fingerprints of keys written to ``epoch`` (a new epoch's filter is
        sized for ``capacity`` keys)."""
        filt = self._filters.get(epoch)
        if filt is None:
            filt = self._filters[epoch] = KeyFilter(capacity)
        filt.add(fps)

    def clear(self) -> None:
        """Forget every filter (they are to be built again)."""
        self._filters.clear()

    def numbers(self) -> list[int]:
        """The epochs that have a filter."""
        return list(self._filters)

    def drop(self, epoch: int) -> None:
        self._filters.pop(epoch, None)
        self._unlink(epoch)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self._filters.values())

    @property
    def count(self) -> int:
        return sum(f.count for f in self._filters.values())
