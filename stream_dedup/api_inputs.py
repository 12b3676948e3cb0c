"""What :class:`~stream_dedup.api.Detector`'s methods accept, checked as decoded input is.

A wrong argument is told apart from a wrong document: a single text where a list belongs
is a ``TypeError`` saying what to pass instead (iterating it would give one item per
character), and a document without a str id or text a
:class:`~stream_dedup.errors.DecodeError`, the error a malformed input line gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from stream_dedup.errors import DecodeError
from stream_dedup.models import Document

__all__ = ["batches", "document", "kind", "refuse_one_text", "text_of"]


def document(item: Document | tuple[str, str]) -> Document:
    """A document from what :meth:`Detector.add_many` accepts, checked like decoded input."""
    if isinstance(item, Document):
        doc_id, text = item.id, item.content
    elif isinstance(item, str | bytes):  # a two-letter string would unpack as a pair
        raise DecodeError(
            "invalid_id", f"expected a Document or an (id, text) pair, got {kind(item)}"
        )
    else:
        try:
            doc_id, text = item
        except (TypeError, ValueError):
            raise DecodeError(
                "invalid_id", f"expected a Document or an (id, text) pair, got {kind(item)}"
            ) from None
    if not isinstance(doc_id, str):
        raise DecodeError("invalid_id", f"a document id must be a str, got {kind(doc_id)}")
    if not doc_id:
        raise DecodeError("invalid_id", "a document id must not be empty")
    if not isinstance(text, str):
        raise DecodeError(
            "invalid_content", f"the text of {doc_id!r} must be a str, got {kind(text)}"
        )
    return item if isinstance(item, Document) else Document(doc_id, text)


def refuse_one_text(given: object, method: str, items: str, single: str) -> None:
    """A str (or bytes) where a collection belongs is a TypeError: iterating it would
    give one item per character."""
    if isinstance(given, str | bytes | bytearray):
        raise TypeError(
            f"{method}() takes a list (or any iterable) of {items}, got a single "
            f"{kind(given)}: pass a list, e.g. {method}([...]), or call {single} for one"
        )


def text_of(item: str | Document) -> str:
    """The text of what a check is given: a text, or a document's content."""
    text = item.content if isinstance(item, Document) else item
    if not isinstance(text, str):
        raise DecodeError("invalid_content", f"a text must be a str, got {kind(text)}")
    return text


def kind(value: object) -> str:
    return type(value).__name__


def batches(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    it = iter(docs)
    while batch := list(islice(it, size)):
        yield batch
