"""Opening the offline input: a file or standard input, plain or gzip, and never the output.

Input is JSON Lines from a file or standard input, plain or gzip-compressed (recognised by
its first bytes, whatever the file is called), with or without a UTF-8 byte order mark.
Read errors become :class:`~stream_dedup.errors.InputError` naming the input, so they
reach the user as what to do rather than as a traceback.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import zlib
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, Protocol

from stream_dedup.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"


class _Readable(Protocol):
    """What the input is read through: a file, standard input, or a ``GzipFile`` over them."""

    def read(self, size: int = -1, /) -> bytes: ...


class _Reader(io.RawIOBase):
    """``head`` (bytes read ahead to look at them), then the rest of ``stream`` (with
    ``partial``, each read takes what the stream has, up to the size asked for).

    Read errors of ``stream`` (an unreadable file, a corrupt or truncated gzip stream)
    become :class:`InputError` naming the input, so they reach the user as what to do
    rather than as a traceback.
    """

    def __init__(self, head: bytes, stream: _Readable, name: str, partial: bool = False) -> None:
        super().__init__()
        self._head = head
        self._stream = stream
        self._name = name
        self._partial = partial

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = _read(self._stream, len(view), self._name, partial=self._partial)
        view[: len(data)] = data
        return len(data)


def _read(stream: _Readable, size: int, name: str, *, partial: bool = False) -> bytes:
    """``size`` bytes of ``stream`` (fewer at its end), or with ``partial`` at most ``size``
    in one read of the stream beneath (fewer when no more have arrived yet, as on a pipe);
    read errors as :class:`InputError`."""
    read = getattr(stream, "read1", stream.read) if partial else stream.read
    try:
        data: bytes = read(size)
        return data
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise InputError(
            f"cannot read {name}: it starts like gzip but the compressed data is corrupt or "
            f"cut short ({exc}). Check it with `gzip -t`, or give the uncompressed JSON Lines"
        ) from exc
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from exc


def open_input(path: str, stack: ExitStack) -> IO[bytes]:
    """The binary input stream for a path argument: ``-`` is standard input.

    gzip input, a file or standard input, is recognised by its magic bytes (a name need
    not end in ``.gz``, and standard input has none) and decompressed as it is read; a
    leading UTF-8 byte order mark, which some editors and exporters write, is dropped, or
    line 1 would not parse. A file that cannot be opened raises :class:`InputError`.
    """
    name = "standard input" if path == "-" else path
    raw: IO[bytes]
    if path == "-":
        raw = sys.stdin.buffer
    else:
        try:
            raw = stack.enter_context(Path(path).open("rb"))  # noqa: SIM115 (closed by the stack)
        except FileNotFoundError as exc:
            raise InputError(
                f"input {path} does not exist: check the path, or pass - to read standard input"
            ) from exc
        except OSError as exc:
            raise InputError(f"cannot open input {path}: {exc.strerror or exc}") from exc
    head = _read(raw, len(GZIP_MAGIC), name)
    stream: _Readable = raw
    if head == GZIP_MAGIC:
        stream = gzip.GzipFile(fileobj=io.BufferedReader(_Reader(head, raw, name)), mode="rb")
        head = b""
    while len(head) < len(UTF8_BOM) and (more := _read(stream, len(UTF8_BOM) - len(head), name)):
        head += more
    head = head.removeprefix(UTF8_BOM)
    # Plain input is read as it comes, so lines from a pipe are decided as they arrive, not
    # once a megabyte has; gzip input in whole buffers, so a corrupt stream fails before
    # anything of the buffer around it is decided.
    plain = stream is raw
    return io.BufferedReader(_Reader(head, stream, name, plain), buffer_size=1 << 20)


def output_over_input(input_path: str, output_path: str) -> str | None:
    """Why writing to ``output_path`` would destroy ``input_path``, or ``None`` if it would not.

    Opening the output for writing empties it before the first line of the input is read,
    so the output must not be the input file: not the same path, nor the same file under
    another name (a relative path, a symbolic link, a hard link). Standard input counts as
    the file it is redirected from (``dedup - -o in.jsonl < in.jsonl``). An output that
    does not exist yet, or ``-`` (standard output), is never the input.
    """
    if output_path == "-":
        return None
    try:
        written = Path(output_path).stat()
        read = os.fstat(sys.stdin.fileno()) if input_path == "-" else Path(input_path).stat()
    except (OSError, ValueError):  # no such output (or input: reported when it is opened)
        return None
    if not os.path.samestat(read, written) or not stat.S_ISREG(written.st_mode):
        return None
    source = "standard input's file" if input_path == "-" else f"input {input_path}"
    return (
        f"the output {output_path} is the {source} (the same file): writing the verdicts "
        "there would empty it before it is read. Name another file with -o, or -o - to "
        "write to standard output"
    )
