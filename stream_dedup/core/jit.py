"""Kernels written once, run compiled by numba or as plain Python: which one, by batch size.

Importing numba and loading the compiled kernels from its cache costs about 1.5 s of CPU,
far more than a run over a few documents takes. So the kernel modules (:mod:`._kernels`,
:mod:`._match_kernels`, :mod:`.lookup_keys`, :mod:`stream_dedup.index.filter`) do not import
numba: they mark their loops with :func:`kernel`, which leaves each an ordinary Python
function, and the callers go through :func:`choose`, which hands back the compiled form
(:func:`compiled`, numba imported on first need) or the Python one. One source for both:
numba compiles the very function that Python runs, so the two give the same numbers; the
tests run both over the bundled corpora and compare verdicts and index bytes.

The rule (:func:`runs_compiled`): compiled for a batch of more than :data:`SMALL_BATCH`
documents, or for a loop over more than :data:`SMALL_ITEMS` items (index keys, or the
members of a batch's buckets: a few documents matched against a large index verify many
candidates), or whenever numba is loaded already, since then only the cache load is left
to pay and a long-lived process (the service, after its warm-up) keeps the one path.
Below that, the Python loops take less time than loading numba would (docs/benchmarks.md,
2026-11-25).

The Python form runs with numpy's overflow warnings off: numba's 64-bit integers wrap
silently, numpy's scalars wrap too but warn, and the hashes rely on the wrap.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

#: The most documents a batch may have and still run the Python forms. The Python loops
#: cost about 2.5 ms per news article, loading numba and its cached kernels about 1.5 s:
#: even at 500 articles the Python forms were no slower (2026-11-25). A quarter of that
#: leaves room for documents with more candidates and for slower machines.
SMALL_BATCH = 128
#: The same bound for the loops over index keys (key filter, fingerprints) and over the
#: members of a batch's buckets (candidates to verify): about as many keys as a batch of
#: :data:`SMALL_BATCH` documents looks up.
SMALL_ITEMS = 32 * SMALL_BATCH

_JIT: dict[str, Any] = {"nogil": True, "cache": True, "boundscheck": False}
_MARK = "__stream_dedup_kernel__"
_compiled: dict[Callable[..., Any], Any] = {}
#: Pushed by :func:`forced`: the last entry is the path every choice takes (empty: by size).
_forced: list[bool] = []


def kernel(fn: F) -> F:
    """Mark ``fn`` as a kernel: Python as written, compiled on demand by :func:`compiled`.

    A kernel may call other kernels by their module-level names: the compiled form calls
    their compiled forms.
    """
    setattr(fn, _MARK, True)
    return fn


def compiled(fn: F) -> F:
    """The numba-compiled form of kernel ``fn`` (numba is imported on the first call).

    numba resolves the globals a function calls when it compiles it, so the compiled form
    is a copy of ``fn`` whose globals name the compiled forms of the kernels it calls. The
    copy keeps ``fn``'s code, file and name, which is what numba's on-disk cache is keyed
    on, so the cache works as it does for a decorated function.
    """
    if fn in _compiled:
        return _compiled[fn]  # type: ignore[no-any-return]
    if not getattr(fn, _MARK, False):
        raise TypeError(f"{fn.__qualname__} is not marked as a kernel")
    import numba

    scope = dict(fn.__globals__)
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    functools.update_wrapper(copy, fn)
    dispatcher = numba.njit(**_JIT)(copy)
    _compiled[fn] = dispatcher  # before the callees: kernels may call each other
    for name, value in list(scope.items()):
        if callable(value) and getattr(value, _MARK, False):
            scope[name] = compiled(value)
    return dispatcher  # type: ignore[no-any-return]


def python(fn: F) -> F:
    """Kernel ``fn`` run as plain Python, its integers wrapping silently as numba's do."""

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        with np.errstate(over="ignore"):
            return fn(*args)

    return run  # type: ignore[return-value]


def runs_compiled(documents: int = 0, items: int = 0) -> bool:
    """Whether work over ``documents`` documents, or ``items`` keys or bucket members,
    runs compiled (see the module docstring)."""
    if _forced:
        return _forced[-1]
    return documents > SMALL_BATCH or items > SMALL_ITEMS or "numba" in sys.modules


def choose(fn: F, documents: int = 0, items: int = 0) -> F:
    """Kernel ``fn`` in the form :func:`runs_compiled` picks for work of that size."""
    return compiled(fn) if runs_compiled(documents, items) else python(fn)


@contextmanager
def forced(use_compiled: bool) -> Iterator[None]:
    """Every choice made inside takes the compiled path (True) or the Python one (False).

    For the warm-up, which is there to load the compiled kernels, and for the tests and
    benchmarks that hold one path against the other.
    """
    _forced.append(use_compiled)
    try:
        yield
    finally:
        _forced.pop()
