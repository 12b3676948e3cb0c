"""The exception tree is complete: every exception class of the package is a StreamDedupError.

A caller catching :class:`StreamDedupError` must see every error the package raises on
purpose, so a new exception class outside the tree fails here. The tree drawn in
:mod:`stream_dedup.errors` must name each class too.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import stream_dedup
from stream_dedup import errors
from stream_dedup.errors import StreamDedupError


def package_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the package, by qualified name.

    Entry points (``__main__`` modules) are not imported: importing them runs them.
    """
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(stream_dedup.__path__, "stream_dedup."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{value.__qualname__}"] = value
    return found


def test_the_walk_finds_the_exceptions_outside_errors_py() -> None:
    names = set(package_exceptions())
    assert "stream_dedup.errors.IndexIOError" in names
    assert "stream_dedup.service.kafka.DeliveryAbandonedError" in names
    assert "stream_dedup.service.prefetch.worker.SketchWorkerError" in names


def test_every_exception_class_of_the_package_is_a_stream_dedup_error() -> None:
    outside = sorted(
        name for name, cls in package_exceptions().items() if not issubclass(cls, StreamDedupError)
    )
    assert not outside, f"exception classes outside the tree of stream_dedup.errors: {outside}"


def test_the_drawn_tree_names_every_exception_class() -> None:
    doc = errors.__doc__ or ""
    missing = sorted(
        cls.__name__ for cls in package_exceptions().values() if f" {cls.__name__} " not in doc
    )
    assert not missing, f"add these to the tree in stream_dedup/errors.py's docstring: {missing}"
