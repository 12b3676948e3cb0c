"""The command line's detector flags, derived from :class:`DedupConfig`'s fields.

Each parameter is defined once, in :mod:`stream_dedup.core.config` (default, help text,
whether the index stores it); the flags here are generated from those fields, so a new
parameter, or a changed default, reaches ``dedup --help`` and ``tune --help`` by itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

from stream_dedup.core.config import DedupConfig

_FIELDS = {f.name: f for f in dataclasses.fields(DedupConfig)}
_HINTS = typing.get_type_hints(DedupConfig)


def _flags(name: str) -> tuple[str, ...]:
    given: tuple[str, ...] = _FIELDS[name].metadata["flags"]
    return given or ("--" + name.replace("_", "-"),)


def add_detector_options(
    parser: argparse.ArgumentParser,
    names: Sequence[str] | None = None,
    title: str = "detection (default: the index's value where it has one, else shown)",
) -> None:
    """Add a flag for each detector parameter in ``names`` (all by default).

    Every flag defaults to ``None``, "not given", so that :func:`detector_config` can tell
    a value the user chose from one to take from an existing index.
    """
    group = parser.add_argument_group(title)
    for name in names if names is not None else list(_FIELDS):
        f = _FIELDS[name]
        hint = _HINTS[name]
        kwargs: dict[str, Any] = {"dest": name, "default": None}
        if typing.get_origin(hint) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(hint))
        else:
            kwargs["type"] = hint
        suffix = " (stored in the index)" if f.metadata["stored"] else ""
        kwargs["help"] = f"{f.metadata['help']} ({f.default}){suffix}"
        group.add_argument(*_flags(name), **kwargs)


def detector_config(args: argparse.Namespace, base: DedupConfig | None = None) -> DedupConfig:
    """``base`` (an index's configuration, or the defaults) with the flags given on top
    (see :meth:`DedupConfig.updated`)."""
    given = {n: getattr(args, n) for n in _FIELDS if getattr(args, n, None) is not None}
    return (base or DedupConfig()).updated(**given)
