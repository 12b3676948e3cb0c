"""The parameters an index is built with, persisted in it and checked on every open."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from stream_dedup.core.config import DedupConfig, IndexPolicy, VerifyMode
from stream_dedup.core.normalize import NORMALIZER_VERSION
from stream_dedup.core.shingles import SHINGLER_VERSION
from stream_dedup.core.signature import SIGNATURE_SCHEME
from stream_dedup.errors import IndexCorruptError

#: Version of the on-disk layout (keys and value encodings in :mod:`.keys`, :mod:`.records`).
#: 3: exact verification stores compressed normalised text, not verification sets.
FORMAT_VERSION = 3
#: Formats this version opens and decides on: a format-2 index is read as it is (its
#: document records decode as before) and becomes format 3 at its first commit, from
#: which on its new records hold texts (:mod:`stream_dedup.index.records`).
READABLE_FORMATS = frozenset({2, 3})


@dataclass(frozen=True, slots=True)
class IndexParams:
    """Everything that decides which bytes the index holds.

    Two runs agree on verdicts only if all of these agree, so the index refuses to open
    with any difference (see :class:`~stream_dedup.errors.IndexMismatchError`).
    """

    normalizer_version: int
    shingler_version: int
    shingle_kind: str
    shingle_k: int
    signature_scheme: str
    num_perm: int
    seed: int
    bands: int
    rows: int
    threshold: float
    verify: VerifyMode
    index_policy: IndexPolicy
    format_version: int = FORMAT_VERSION

    @classmethod
    def of(cls, config: DedupConfig) -> IndexParams:
        """The parameters an index built with ``config`` stores (bands and rows resolved)."""
        plan = config.band_plan()
        return cls(
            normalizer_version=NORMALIZER_VERSION,
            shingler_version=SHINGLER_VERSION,
            shingle_kind=config.shingle.kind,
            shingle_k=config.shingle.k,
            signature_scheme=SIGNATURE_SCHEME,
            num_perm=config.num_perm,
            seed=config.seed,
            bands=plan.bands,
            rows=plan.rows,
            threshold=config.threshold,
            verify=config.verify,
            index_policy=config.index_policy,
        )

    def dedup_config(self, **overrides: object) -> DedupConfig:
        """The configuration this index was built with (for `dedup` on an existing index)."""
        values: dict[str, object] = {
            "threshold": self.threshold,
            "num_perm": self.num_perm,
            "seed": self.seed,
            "shingle_kind": self.shingle_kind,
            "shingle_size": self.shingle_k,
            "bands": self.bands,
            "rows": self.rows,
            "verify": self.verify,
            "index_policy": self.index_policy,
        }
        values.update(overrides)
        return DedupConfig(**values)  # type: ignore[arg-type]

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> IndexParams:
        try:
            data: dict[str, Any] = json.loads(raw)
            return cls(**{f.name: data[f.name] for f in fields(cls)})
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexCorruptError(f"index metadata does not parse: {exc}") from exc

    def current(self) -> IndexParams:
        """These parameters in the format this version writes."""
        return replace(self, format_version=FORMAT_VERSION)

    def mismatch(self, other: IndexParams) -> dict[str, tuple[object, object]]:
        """:meth:`differences` that matter: none between formats both readable here."""
        found = self.differences(other)
        formats = {self.format_version, other.format_version}
        if "format_version" in found and formats <= READABLE_FORMATS:
            del found["format_version"]
        return found

    def differences(self, other: IndexParams) -> dict[str, tuple[object, object]]:
        """``{name: (self's value, other's value)}`` for every parameter that differs."""
        mine, theirs = asdict(self), asdict(other)
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
