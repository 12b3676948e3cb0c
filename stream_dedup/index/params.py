"""The parameters an index is built with, persisted in it and checked on every open."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from stream_dedup.core.config import DedupConfig, IndexPolicy, VerifyMode
from stream_dedup.core.containment import SAMPLE_CAP, SAMPLE_RATE
from stream_dedup.core.normalize import NORMALIZER_VERSION
from stream_dedup.core.shingles import SHINGLER_VERSION
from stream_dedup.core.signature import SIGNATURE_SCHEME
from stream_dedup.errors import IndexCorruptError

#: Version of the on-disk layout (keys and value encodings in :mod:`.keys`, :mod:`.records`).
#: 3: a verdict record holds one verdict per revision of its id (``docs/revisions.md``).
#: 4: exact verification stores compressed normalised text, not verification sets
#: (``docs/payload.md``).
#: 5: on Redis, band buckets hold their members in 4 bytes each where they fit
#: (:mod:`.redis_members`); RocksDB and memory indexes store what format 4 does.
#: 6: payloads may be compressed with a dictionary the index stores (payload codec 3,
#: :mod:`stream_dedup.core.payload_dictionary`).
FORMAT_VERSION = 6

#: Older versions this one reads as they are and upgrades: a format 2 verdict record is a
#: format 3 record of one revision; a document record of format 2 or 3 holds a
#: verification set, read as it is, where one of format 4 holds text (marked in the
#: record, so both kinds can sit in one index); a bucket of format 4 or older holds 8-byte
#: members, told from a 4-byte one by its length; a payload of format 5 or older has no
#: dictionary, told by its codec byte. The first commit stores the new version, so that an
#: older stream-dedup then refuses the index (it could not read a second revision, a
#: 4-byte bucket or a dictionary's payload) instead of failing on the first record it
#: cannot parse.
UPGRADABLE_FORMATS = (2, 3, 4, 5)

#: The parameters an index without containment does not write (read as 0).
_CONTAINMENT = ("containment", "containment_rate", "containment_cap")


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
    #: Containment (``docs/containment.md``): the setting, the sampling rate of the
    #: sampled-value keys and the members such a bucket takes. All 0 when off, and then
    #: not written, so an index without containment stores the metadata it always did.
    containment: float = 0.0
    containment_rate: int = 0
    containment_cap: int = 0

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
            containment=config.containment,
            containment_rate=SAMPLE_RATE if config.containment else 0,
            containment_cap=SAMPLE_CAP if config.containment else 0,
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
            "containment": self.containment,
        }
        values.update(overrides)
        return DedupConfig(**values)  # type: ignore[arg-type]

    def upgraded(self) -> tuple[IndexParams, bool]:
        """These parameters at :data:`FORMAT_VERSION`, and whether that is an upgrade (see
        :data:`UPGRADABLE_FORMATS`); other versions stay as they are, and are refused."""
        if self.format_version not in UPGRADABLE_FORMATS:
            return self, False
        return replace(self, format_version=FORMAT_VERSION), True

    def to_bytes(self) -> bytes:
        values = asdict(self)
        if not self.containment:
            for name in _CONTAINMENT:
                del values[name]
        return json.dumps(values, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> IndexParams:
        try:
            data: dict[str, Any] = json.loads(raw)
            given = {f.name: data[f.name] for f in fields(cls) if f.name not in _CONTAINMENT}
            return cls(**given, **{n: data.get(n, 0) for n in _CONTAINMENT})
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexCorruptError(f"index metadata does not parse: {exc}") from exc

    def differences(self, other: IndexParams) -> dict[str, tuple[object, object]]:
        """``{name: (self's value, other's value)}`` for every parameter that differs."""
        mine, theirs = asdict(self), asdict(other)
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
