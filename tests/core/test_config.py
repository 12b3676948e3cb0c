"""Each detector parameter is defined once, and everything else derives from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from stream_dedup.cli.app import build_parser
from stream_dedup.cli.detector_options import detector_config
from stream_dedup.core.config import DedupConfig
from stream_dedup.errors import ConfigError
from stream_dedup.index.params import IndexParams
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.config_loading import load_config

FIELDS = {f.name: f for f in dataclasses.fields(DedupConfig)}
#: A value other than the default, for every parameter.
OTHER = {
    "threshold": 0.7,
    "num_perm": 64,
    "seed": 9,
    "bands": 8,
    "rows": 4,
    "recall_at_threshold": 0.9,
    "shingle_kind": "word",
    "shingle_size": 2,
    "verify": "signature",
    "index_policy": "uniques",
    "revisions": "replay",
    "max_bucket_size": 17,
    "max_candidates": 7,
    "containment": 0.75,
}


def test_every_parameter_has_help_and_a_storage_rule() -> None:
    assert set(OTHER) == set(FIELDS)
    for f in FIELDS.values():
        assert f.metadata["help"], f.name
        assert isinstance(f.metadata["stored"], bool), f.name


@pytest.mark.parametrize("name", sorted(OTHER))
def test_the_index_stores_exactly_the_stored_parameters(name: str) -> None:
    changes: dict[str, object] = {name: OTHER[name]}
    fixed: dict[str, object] = {}
    if name in ("bands", "rows"):  # only together
        changes = {"bands": OTHER["bands"], "rows": OTHER["rows"]}
    if name == "recall_at_threshold":  # it picks the bands, which are stored: hold them
        fixed = {"bands": 18, "rows": 7}
    base = IndexParams.of(DedupConfig(**fixed))  # type: ignore[arg-type]
    changed = IndexParams.of(DedupConfig(**fixed, **changes))  # type: ignore[arg-type]
    assert (changed != base) == FIELDS[name].metadata["stored"]


@pytest.mark.parametrize("verify", ["signature", "exact"])
def test_stored_parameters_come_back_from_the_index(verify: str) -> None:
    # Containment counts shingles of stored texts: it needs exact verification.
    stored = {n: v for n, v in OTHER.items() if FIELDS[n].metadata["stored"]}
    stored["verify"] = verify
    if verify == "signature":
        stored["containment"] = 0.0
    config = DedupConfig(**stored)  # type: ignore[arg-type]
    again = IndexParams.of(config).dedup_config()
    assert {n: getattr(again, n) for n in stored} == stored
    assert IndexParams.from_bytes(IndexParams.of(config).to_bytes()) == IndexParams.of(config)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_containment_outside_its_range_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match=r"containment.*must be 0 \(off\) or in \(0, 1\]"):
        DedupConfig(containment=value)


def test_containment_needs_exact_verification() -> None:
    with pytest.raises(ConfigError, match="verify = 'exact'"):
        DedupConfig(containment=0.8, verify="signature")


def test_an_index_without_containment_stores_the_metadata_it_always_did() -> None:
    raw = IndexParams.of(DedupConfig()).to_bytes()
    assert b"containment" not in raw
    on = IndexParams.of(DedupConfig(containment=0.8))
    assert (on.containment, on.containment_rate, on.containment_cap) == (0.8, 16, 64)
    assert IndexParams.from_bytes(raw).containment_rate == 0


def _flags_of(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


def test_dedup_has_a_flag_per_parameter_with_its_default_in_the_help() -> None:
    flags = _flags_of("dedup")
    for name, f in FIELDS.items():
        assert name in flags, name
        assert flags[name].default is None  # "not given": the index's value wins
        assert f"({f.default})" in (flags[name].help or "")
    assert flags["verify"].choices == ["exact", "signature"]


def test_tune_flags_are_the_band_tuning_parameters() -> None:
    flags = _flags_of("tune")
    assert {"threshold", "num_perm", "bands", "rows", "recall_at_threshold"} <= set(flags)
    assert "verify" not in flags


def test_the_service_section_is_the_parameters_themselves() -> None:
    config = load_config(None, environ={}, overrides={"dedup": {"threshold": "0.7"}})
    assert isinstance(config, ServiceConfig)
    assert config.dedup == DedupConfig(threshold=0.7)
    with pytest.raises(ConfigError, match=r"dedup\.verify"):
        load_config(None, environ={}, overrides={"dedup": {"verify": 3}})
    with pytest.raises(ConfigError, match="verify"):
        load_config(None, environ={}, overrides={"dedup": {"verify": "nearly"}})
    replaying = load_config(None, environ={}, overrides={"dedup": {"revisions": "replay"}})
    assert isinstance(replaying, ServiceConfig)
    assert replaying.dedup.revisions == "replay"
    assert config.dedup.revisions == "decide"  # the default
    with pytest.raises(ConfigError, match="revisions"):
        load_config(None, environ={}, overrides={"dedup": {"revisions": "sometimes"}})


def _args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{n: given.get(n) for n in FIELDS})


def test_flags_go_on_top_of_an_index_configuration() -> None:
    stored = DedupConfig(threshold=0.7, bands=8, rows=4, shingle_kind="word", shingle_size=2)
    assert detector_config(_args(), stored) == stored
    # A new threshold without bands re-tunes them; a new kind takes its usual size.
    retuned = detector_config(_args(threshold=0.9), stored)
    assert (retuned.bands, retuned.rows) == (0, 0)
    assert retuned.band_plan() == DedupConfig(threshold=0.9).band_plan()
    assert detector_config(_args(shingle_kind="char"), stored).shingle.k == 5
    assert DedupConfig(shingle_kind="word").shingle.k == 3


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"bands": 4}, "bands"),
        ({"shingle_size": -1}, "shingle_size"),
        ({"shingle_size": 99}, "shingle_size"),
        ({"threshold": 1.5}, "threshold"),
        ({"revisions": "ignore"}, "revisions"),
    ],
)
def test_bad_values_name_the_parameter(values: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        DedupConfig(**values)  # type: ignore[arg-type]
    assert caught.value.key == key
