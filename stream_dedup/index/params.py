"""The parameters an index is built with, persisted in it and checked on every open."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from stream_dedup.errors import IndexCorruptError

#: Version of the on-disk layout (keys and value encodings in :mod:`.keys`, :mod:`.records`).
FORMAT_VERSION = 2

VerifyMode = Literal["exact", "signature"]
IndexPolicy = Literal["all", "uniques"]


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

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> IndexParams:
        try:
            data: dict[str, Any] = json.loads(raw)
            return cls(**{f.name: data[f.name] for f in fields(cls)})
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexCorruptError(f"index metadata does not parse: {exc}") from exc

    def differences(self, other: IndexParams) -> dict[str, tuple[object, object]]:
        """``{name: (self's value, other's value)}`` for every parameter that differs."""
        mine, theirs = asdict(self), asdict(other)
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
