"""A setting's value checked against its type, with an error that names the key.

The sections' dataclass fields give each setting its type. A value from the TOML file must
already be of that type (a quoted number there is a mistake worth pointing out, and the
error shows how to write it); a value given as text (an environment variable, a flag) is
parsed into it. Tables become the dataclasses they describe, field by field, and an
unknown key is an error with the closest known one suggested.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from stream_dedup.errors import ConfigError

__all__ = ["build_fields", "coerce"]


#: What a TOML value is, in words, for error messages.
_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a table",
}


def _describe(hint: Any) -> str:
    """The kind of value a setting of type ``hint`` takes, in words."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true or false"
    if hint in _KINDS:
        return _KINDS[hint]
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        return f"a list, each item {_describe(args[0] if args else str)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in hint)
    if dataclasses.is_dataclass(hint):
        return "a table"
    return getattr(hint, "__name__", str(hint))


def _toml(value: Any) -> str:
    """``value`` as it is written in TOML (for suggestions in error messages)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _toml(value.value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _wrong(key: str, hint: Any, value: Any, text: bool) -> ConfigError:
    """The error for a value that is not of its setting's type, with the fix if one is known."""
    kind = _KINDS.get(type(value), type(value).__name__)
    problem = f"expected {_describe(hint)}, got {value!r} ({kind})"
    if not text and isinstance(value, str):
        # A quoted number, flag or list in the file: show how the value is written.
        try:
            meant = coerce(key, hint, value, text=True)
        except ConfigError:
            pass
        else:
            problem += f"; in TOML write {key.rsplit('.', 1)[-1]} = {_toml(meant)}"
    return ConfigError(key, problem)


def coerce(key: str, hint: Any, value: Any, *, text: bool) -> Any:
    """``value`` as a setting of type ``hint``, or a :class:`ConfigError` naming ``key``.

    With ``text`` (environment variables, flags) a string is parsed into the type; without
    (a TOML value) the value must already be of the type, except that an integer is taken
    for a float setting (TOML writes 30 and 30.0 for the same number of seconds).
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(key, hint, value, text)
    if origin is typing.Literal:
        return _coerce_literal(key, hint, value, text)
    if origin is tuple:
        return _coerce_tuple(key, hint, value, text)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _coerce_enum(key, hint, value, text)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, Mapping):
            names = set(value) if text else set()
            return build_fields(key, hint, value, names)
        raise _wrong(key, hint, value, text)
    plain = _PLAIN.get(hint)
    if plain is not None:
        parsed = plain(key, value, text)
        if parsed is not None:
            return parsed
    elif isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _wrong(key, hint, value, text)


def _coerce_union(key: str, hint: Any, value: Any, text: bool) -> Any:
    """The first of the union's types that takes ``value`` (``None`` where it may be)."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    blank = isinstance(value, str) and value.strip().lower() in ("", "none")
    if text and type(None) in args and blank:
        return None
    for option in args:
        if option is type(None):
            continue
        try:
            return coerce(key, option, value, text=text)
        except ConfigError:
            continue
    raise _wrong(key, hint, value, text)


def _coerce_literal(key: str, hint: Any, value: Any, text: bool) -> Any:
    """The literal's choice that ``value`` is (or, as text, spells)."""
    for choice in typing.get_args(hint):
        if type(choice) is type(value) and choice == value:
            return choice
        if text and isinstance(value, str) and str(choice) == value.strip():
            return choice
    raise ConfigError(key, f"must be {_describe(hint)}, got {value!r}")


def _coerce_tuple(key: str, hint: Any, value: Any, text: bool) -> tuple[Any, ...]:
    """A list (as text: comma-separated items) as a tuple of the items' type."""
    args = typing.get_args(hint)
    item = args[0] if args else str
    if text and isinstance(value, str):
        parts = [v.strip() for v in value.split(",") if v.strip()]
        return tuple(coerce(key, item, v, text=True) for v in parts)
    if isinstance(value, list | tuple):
        return tuple(coerce(key, item, v, text=text) for v in value)
    raise _wrong(key, hint, value, text)


def _coerce_enum(key: str, hint: type[enum.Enum], value: Any, text: bool) -> enum.Enum:
    """The member whose value ``value`` is (or, as text, whose name it is)."""
    for member in hint:
        if value == member.value or value is member or (text and value == member.name):
            return member
    raise ConfigError(key, f"must be {_describe(hint)}, got {value!r}")


def _as_bool(key: str, value: Any, text: bool) -> bool | None:
    """``value`` as a boolean, or ``None`` if it is not one."""
    if isinstance(value, bool):
        return value
    if text and isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "1", "yes", "on"):
            return True
        if word in ("false", "0", "no", "off"):
            return False
    return None


def _as_int(key: str, value: Any, text: bool) -> int | None:
    """``value`` as an integer (never a boolean), or ``None`` if it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if text and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    return None


def _as_float(key: str, value: Any, text: bool) -> float | None:
    """``value`` as a finite number (an integer too), or ``None`` if it is no number."""
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif text and isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value.strip())
    if number is not None and not math.isfinite(number):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    return number


def _as_str(key: str, value: Any, text: bool) -> str | None:
    """``value`` if it is a string, else ``None``."""
    return value if isinstance(value, str) else None


#: How a value becomes a setting of each plain type: ``None`` when it cannot, and then
#: :func:`coerce` raises the error of a wrong value (as it does for no other type).
_PLAIN: dict[Any, Callable[[str, Any, bool], Any]] = {
    bool: _as_bool,
    int: _as_int,
    float: _as_float,
    str: _as_str,
}


def build_fields(prefix: str, cls: type[Any], values: Mapping[str, Any], text: set[str]) -> Any:
    """An instance of the dataclass ``cls`` from ``values``, each checked against its field.

    ``text`` names the keys whose values are strings to parse (see
    :class:`~.config_loading.TextLayer`). Unknown keys are errors; a :class:`ConfigError`
    the class raises about one of its own fields is re-raised naming the key as the
    configuration spells it (``dedup.threshold``).
    """
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{prefix}.{key}", f"unknown setting; {hint}known: {', '.join(sorted(known))}"
            )
        kwargs[key] = coerce(f"{prefix}.{key}", hints[key], value, text=key in text)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.key in known:
            raise ConfigError(f"{prefix}.{exc.key}", exc.problem) from exc
        raise
