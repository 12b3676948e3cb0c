"""How the service's settings load: file < environment < flags, each checked against its type.

Every setting lives in one documented TOML file (``config/stream-dedup.toml`` lists them
all with their defaults). Values are layered in a fixed order so an operator can tell
where one came from:

1. the defaults of the sections (:mod:`.config`, the same as in the documented file),
2. the TOML file given with ``--config``,
3. environment variables ``STREAM_DEDUP_<SECTION>__<KEY>`` (e.g.
   ``STREAM_DEDUP_INPUT__TOPICS=news,wire``; in the ``kafka`` section underscores become
   dots: ``STREAM_DEDUP_KAFKA__BOOTSTRAP_SERVERS`` sets ``bootstrap.servers``),
4. command-line flags (``--set section.key=value`` and a few shortcuts).

An unknown section or key, a value of the wrong type or out of range is a
:class:`ConfigError` naming the key: a typo must fail loudly rather than silently run with
a default. Types come from the sections' dataclass fields (:mod:`.config_values` checks
them). A value in the TOML file must already have its setting's type (``max_messages =
"2000"`` is a string, an error: the quotes are a mistake worth pointing out); environment
variables and flags can only be strings, so theirs are parsed
(``STREAM_DEDUP_BATCH__MAX_MESSAGES=2000``). The ``[kafka]``
table's dotted librdkafka keys pass through to the client (see
:mod:`stream_dedup.service.kafka_settings` for how they merge with ours); :func:`load_config` has
librdkafka itself check them, so a misspelt key fails here and not when ``run`` connects.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stream_dedup.errors import ConfigError
from stream_dedup.service.config import (
    KAFKA_DEFAULTS,
    SECTIONS,
    ServiceConfig,
)
from stream_dedup.service.config_values import build_fields

ENV_PREFIX = "STREAM_DEDUP_"


class TextLayer(dict[str, dict[str, Any]]):
    """Settings given as text: environment variables and command-line flags.

    Their values are strings whatever the setting's type, so they are parsed into it
    (``"2000"`` becomes 2000, ``"news,wire"`` a tuple). A TOML file's values are not
    parsed: the file has types, and a string where a number belongs is a mistake there.
    """


def _build_section(name: str, values: Mapping[str, Any], text: set[str] | None = None) -> Any:
    """Section ``name`` from its merged values; ``text`` names the keys given as text."""
    return build_fields(name, SECTIONS[name], values, text or set())


def _merge(
    layers: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, dict[str, Any]], set[tuple[str, str]]]:
    """The layers merged, later wins, and which (section, key) pairs hold text to parse."""
    merged: dict[str, dict[str, Any]] = {}
    from_text: set[tuple[str, str]] = set()
    for layer in layers:
        text = isinstance(layer, TextLayer)
        for section, values in layer.items():
            if section != "kafka" and section not in SECTIONS:
                close = difflib.get_close_matches(section, [*SECTIONS, "kafka"], n=1)
                hint = f"did you mean [{close[0]}]? " if close else ""
                raise ConfigError(
                    section, f"unknown section; {hint}known: kafka, {', '.join(SECTIONS)}"
                )
            if not isinstance(values, dict):
                raise ConfigError(section, "must be a table of settings")
            _deep_update(merged.setdefault(section, {}), values)
            for key in values:
                if text:
                    from_text.add((section, key))
                else:
                    from_text.discard((section, key))
    return merged, from_text


def _deep_update(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    """``into.update(values)``, merging nested tables (``[index.redis]``) key by key."""
    for key, value in values.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, Mapping):
            old = dict(old)
            _deep_update(old, value)
            into[key] = old
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _nest(table: dict[str, Any], path: list[str], value: str) -> None:
    """Set ``table[path[0]][path[1]]... = value``: a setting of a nested table."""
    for part in path[:-1]:
        inner = table.setdefault(part, {})
        if not isinstance(inner, dict):
            raise ConfigError(".".join(path), f"{part} is a setting, not a table")
        table = inner
    table[path[-1]] = value


def read_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The TOML file's tables (not yet validated)."""
    try:
        with Path(path).open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(section, "top-level keys must be [tables]")
    return data


def read_env(environ: Mapping[str, str]) -> TextLayer:
    """Settings from ``STREAM_DEDUP_<SECTION>__<KEY>`` variables (strings, parsed later)."""
    out = TextLayer()
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        if "__" not in rest:
            raise ConfigError(name, "environment overrides are STREAM_DEDUP_<SECTION>__<KEY>")
        section, key = rest.split("__", 1)
        section, key = section.lower(), key.lower()
        if section == "kafka":
            out.setdefault(section, {})[key.replace("_", ".")] = value
        else:  # STREAM_DEDUP_INDEX__REDIS__URL: a key of the nested table [index.redis]
            _nest(out.setdefault(section, {}), key.split("__"), value)
    return out


def parse_assignments(items: list[str]) -> TextLayer:
    """Settings from ``--set section.key=value`` flags (kafka keys keep their dots)."""
    out = TextLayer()
    for item in items:
        name, sep, value = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(item, "use --set section.key=value, e.g. --set batch.max_wait_ms=50")
        if section == "kafka":
            out.setdefault(section, {})[key] = value
        else:  # --set index.redis.url=...: a key of the nested table [index.redis]
            _nest(out.setdefault(section, {}), key.split("."), value)
    return out


def build_config(layers: Sequence[Mapping[str, Any]]) -> ServiceConfig:
    """Validate merged layers (lowest precedence first) into a :class:`ServiceConfig`.

    The strings of a :class:`TextLayer` are parsed into each setting's type; any other
    layer (a TOML file's tables) must hold values of the right type already.
    """
    merged, from_text = _merge(layers)
    kafka = dict(KAFKA_DEFAULTS)
    for key, value in merged.pop("kafka", {}).items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int | float):
            raise ConfigError(f"kafka.{key}", f"must be a string or number, got {value!r}")
        kafka[key] = str(value)
    sections = {
        name: _build_section(name, merged.get(name, {}), {key for s, key in from_text if s == name})
        for name in SECTIONS
    }
    return ServiceConfig(kafka=kafka, **sections)


def load_config(
    path: str | Path | None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> ServiceConfig:
    """File < environment < flags (``overrides``, parsed as text), validated.

    The ``[kafka]`` settings are checked by librdkafka itself (see
    :func:`stream_dedup.service.kafka_settings.check_client_config`), so that ``config check``
    rejects what ``run`` would die on, and ``run`` stops before opening the index.
    """
    # Imported here: the Kafka client is not loaded by modules that only read settings.
    from stream_dedup.service.kafka_settings import check_client_config

    layers: list[Mapping[str, Any]] = [read_file(path) if path is not None else {}]
    layers.append(read_env(os.environ if environ is None else environ))
    flags = TextLayer()
    for section, values in (overrides or {}).items():
        flags[section] = dict(values)
    layers.append(flags)
    config = build_config(layers)
    check_client_config(config.client_settings())
    return config
