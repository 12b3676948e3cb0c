"""Configuration of the detector core: small frozen dataclasses with readable defaults.

The service and the CLI build these from the config file, environment and flags; the core
only ever sees validated values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stream_dedup.core.bands import (
    DEFAULT_RECALL_AT_THRESHOLD,
    BandPlan,
    choose_bands,
    explicit_bands,
)
from stream_dedup.core.shingles import ShingleSpec
from stream_dedup.errors import ConfigError

VerifyMode = Literal["exact", "signature"]
IndexPolicy = Literal["all", "uniques"]


@dataclass(frozen=True, slots=True)
class DocumentFormat:
    """How a JSON object becomes a document: which field is the id, which hold the text.

    Content fields are joined by ``joiner`` in the order given; a missing or null field
    counts as absent, and a document with none of them present is malformed.
    """

    id_field: str = "id"
    content_fields: tuple[str, ...] = ("title", "text")
    joiner: str = "\n"

    def __post_init__(self) -> None:
        if not self.id_field:
            raise ConfigError("id_field", "must not be empty")
        if not self.content_fields:
            raise ConfigError("content_fields", "name at least one field")


@dataclass(frozen=True, slots=True)
class DedupConfig:
    """Everything that decides verdicts.

    ``max_bucket_size`` bounds how many (most recent) documents a band bucket remembers and
    ``max_candidates`` how many candidates are verified per document, so that boilerplate
    shared by thousands of documents cannot make lookups slow; both truncations are counted.
    """

    threshold: float = 0.8
    num_perm: int = 128
    seed: int = 1
    shingle: ShingleSpec = field(default_factory=ShingleSpec)
    bands: int | None = None
    rows: int | None = None
    recall_at_threshold: float = DEFAULT_RECALL_AT_THRESHOLD
    verify: VerifyMode = "exact"
    index_policy: IndexPolicy = "all"
    max_bucket_size: int = 256
    max_candidates: int = 100

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError("threshold", f"must be in (0, 1], got {self.threshold}")
        if not 1 <= self.num_perm <= 4096:
            raise ConfigError("num_perm", f"must be between 1 and 4096, got {self.num_perm}")
        if (self.bands is None) != (self.rows is None):
            raise ConfigError("bands", "give both bands and rows, or neither (then they are tuned)")
        if self.verify not in ("exact", "signature"):
            raise ConfigError("verify", f"must be 'exact' or 'signature', got {self.verify!r}")
        if self.index_policy not in ("all", "uniques"):
            raise ConfigError(
                "index_policy", f"must be 'all' or 'uniques', got {self.index_policy!r}"
            )
        if self.max_bucket_size < 1:
            raise ConfigError("max_bucket_size", f"must be positive, got {self.max_bucket_size}")
        if self.max_candidates < 1:
            raise ConfigError("max_candidates", f"must be positive, got {self.max_candidates}")
        try:
            self.band_plan()
        except ValueError as exc:
            raise ConfigError("bands" if self.bands else "threshold", str(exc)) from exc

    def band_plan(self) -> BandPlan:
        """The explicit (bands, rows) if given, else the tuned choice."""
        if self.bands is not None and self.rows is not None:
            return explicit_bands(self.bands, self.rows, self.num_perm, self.threshold)
        return choose_bands(self.threshold, self.num_perm, self.recall_at_threshold)
