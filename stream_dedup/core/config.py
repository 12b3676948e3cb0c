"""The detector's parameters: one frozen dataclass, each parameter defined once.

The service's ``[dedup]`` configuration section, the command line's detector flags and the
parameters an index stores all derive from :class:`DedupConfig`'s fields; the core only
ever sees validated values. The band and shingle modules (numpy) load when a
configuration is first built, not with this module, so ``--help`` lists the flags
without loading numpy.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stream_dedup.errors import ConfigError

if TYPE_CHECKING:
    from stream_dedup.core.bands import BandPlan
    from stream_dedup.core.shingles import ShingleSpec

VerifyMode = Literal["exact", "signature"]
IndexPolicy = Literal["all", "uniques"]
RevisionMode = Literal["decide", "replay"]


ShingleKind = Literal["char", "word"]

#: The shingle size a kind gets when none is given: 5 characters, or 3 words.
DEFAULT_SHINGLE_SIZE: dict[str, int] = {"char": 5, "word": 3}

#: The default tuning target: P(candidate) for a pair at exactly the threshold.
DEFAULT_RECALL_AT_THRESHOLD = 0.95


def _param(default: Any, help: str, *, stored: bool, flags: tuple[str, ...] = ()) -> Any:
    """A detector parameter: its default, its help text, and whether the index stores it.

    This is the one definition of each parameter: the ``[dedup]`` section of the service
    configuration is :class:`DedupConfig` itself, the command line's detector flags are
    derived from these fields (``flags`` overrides the derived ``--name``), and
    :class:`~stream_dedup.index.params.IndexParams` stores the ``stored`` ones (with bands,
    rows and the shingle size resolved).
    """
    return field(default=default, metadata={"help": help, "stored": stored, "flags": flags})


#: What a numeric parameter takes, by its annotation: (accepted types, in words).
_NUMERIC: dict[str, tuple[type, str]] = {
    "float": (numbers.Real, "a number"),
    "int": (numbers.Integral, "an integer"),
}


def _check_types(config: DedupConfig) -> None:
    """A numeric parameter given a value of another type (a string, a boolean) is a
    :class:`ConfigError` naming it and the type it takes, before any range is compared."""
    for f in dataclasses.fields(config):
        expected = _NUMERIC.get(str(f.type))
        value = getattr(config, f.name)
        if expected and (isinstance(value, bool) or not isinstance(value, expected[0])):
            raise ConfigError(
                f.name, f"expected {expected[1]}, got {value!r} ({type(value).__name__})"
            )


@dataclass(frozen=True, slots=True)
class DedupConfig:
    """Everything that decides verdicts: the detector's parameters, each defined once.

    ``max_bucket_size`` bounds how many (most recent) documents a band bucket remembers and
    ``max_candidates`` how many candidates are verified per document, so that boilerplate
    shared by thousands of documents cannot make lookups slow; both truncations are counted.
    Zero for ``bands`` and ``rows`` means "tuned for the threshold", and for
    ``shingle_size`` "the kind's usual size": the values a configuration file can spell.
    """

    threshold: float = _param(
        0.8, "Jaccard similarity at or above which a document is a duplicate", stored=True
    )
    num_perm: int = _param(128, "signature length K (hash values per document)", stored=True)
    seed: int = _param(1, "hash seed", stored=True)
    bands: int = _param(
        0, "LSH bands, with rows; 0 and 0: tuned for the threshold (see `tune`)", stored=True
    )
    rows: int = _param(0, "rows per LSH band, with bands; 0: tuned", stored=True)
    recall_at_threshold: float = _param(
        DEFAULT_RECALL_AT_THRESHOLD,
        "tuning target: P(candidate) for a pair at exactly the threshold",
        stored=False,
    )
    shingle_kind: ShingleKind = _param(
        "char", "shingles: character k-grams or word n-grams", stored=True, flags=("--shingle",)
    )
    shingle_size: int = _param(
        0,
        "shingle size in characters or words; 0: 5 for char, 3 for word",
        stored=True,
        flags=("-k", "--shingle-size"),
    )
    verify: VerifyMode = _param(
        "exact",
        "verify candidates by exact Jaccard of stored shingle sets, or by the signature "
        "estimate (smaller index)",
        stored=True,
    )
    index_policy: IndexPolicy = _param(
        "all",
        "which documents enter the index: all (catches chains of edits) or uniques",
        stored=True,
    )
    revisions: RevisionMode = _param(
        "decide",
        "an id seen again with other text: decide it as a new revision, or replay the id's verdict",
        stored=False,
    )
    containment: float = _param(
        0.0,
        "report a document this share of whose shingles are in one earlier document as its "
        "excerpt (0: off; 0.8 is a good value when on)",
        stored=True,
    )
    max_bucket_size: int = _param(256, "documents remembered per band bucket", stored=False)
    max_candidates: int = _param(100, "candidates verified per document", stored=False)

    def __post_init__(self) -> None:
        _check_types(self)
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError("threshold", f"must be in (0, 1], got {self.threshold}")
        if not 1 <= self.num_perm <= 4096:
            raise ConfigError("num_perm", f"must be between 1 and 4096, got {self.num_perm}")
        if self.bands < 0 or self.rows < 0 or (self.bands == 0) != (self.rows == 0):
            raise ConfigError("bands", "give both bands and rows, or neither (then they are tuned)")
        if self.shingle_kind not in DEFAULT_SHINGLE_SIZE:
            raise ConfigError(
                "shingle_kind", f"must be 'char' or 'word', got {self.shingle_kind!r}"
            )
        if self.shingle_size < 0:
            raise ConfigError("shingle_size", f"must be >= 0 (0: usual), got {self.shingle_size}")
        if self.verify not in ("exact", "signature"):
            raise ConfigError("verify", f"must be 'exact' or 'signature', got {self.verify!r}")
        if self.index_policy not in ("all", "uniques"):
            raise ConfigError(
                "index_policy", f"must be 'all' or 'uniques', got {self.index_policy!r}"
            )
        if self.revisions not in ("decide", "replay"):
            raise ConfigError("revisions", f"must be 'decide' or 'replay', got {self.revisions!r}")
        if not 0.0 <= self.containment <= 1.0:
            raise ConfigError(
                "containment", f"must be 0 (off) or in (0, 1], got {self.containment}"
            )
        if self.containment and self.verify != "exact":
            raise ConfigError(
                "containment", "needs verify = 'exact': it counts shingles against stored texts"
            )
        if self.max_bucket_size < 1:
            raise ConfigError("max_bucket_size", f"must be positive, got {self.max_bucket_size}")
        if self.max_candidates < 1:
            raise ConfigError("max_candidates", f"must be positive, got {self.max_candidates}")
        try:
            self.band_plan()
        except ValueError as exc:
            raise ConfigError("bands" if self.bands else "threshold", str(exc)) from exc
        try:
            _ = self.shingle  # ShingleSpec checks the size
        except ValueError as exc:
            raise ConfigError("shingle_size", str(exc)) from exc

    def updated(self, **given: Any) -> DedupConfig:
        """This configuration with the ``given`` parameters changed.

        Values derived from the old parameters are let go rather than kept: a new threshold
        or signature length without explicit bands has bands and rows tuned again, and a new
        shingle kind without a size takes that kind's usual size (an index's stored
        configuration holds them resolved, chosen for its own parameters). The command
        line's flags and the Python API apply parameters over an existing index this way.
        """
        values = dict(given)
        if values.keys() & {"threshold", "num_perm"} and "bands" not in values:
            values["bands"] = 0
            values.setdefault("rows", 0)
        if "shingle_kind" in values and "shingle_size" not in values:
            values["shingle_size"] = 0
        return dataclasses.replace(self, **values)

    @property
    def shingle(self) -> ShingleSpec:
        """The shingle kind and its size, resolved."""
        from stream_dedup.core.shingles import ShingleSpec

        size = self.shingle_size or DEFAULT_SHINGLE_SIZE[self.shingle_kind]
        return ShingleSpec(self.shingle_kind, size)

    def band_plan(self) -> BandPlan:
        """The explicit (bands, rows) if given, else the tuned choice."""
        from stream_dedup.core.bands import choose_bands, explicit_bands

        if self.bands and self.rows:
            return explicit_bands(self.bands, self.rows, self.num_perm, self.threshold)
        return choose_bands(self.threshold, self.num_perm, self.recall_at_threshold)
