"""Normalisation: NFKC, casefold, whitespace collapsed, stripped; versioned."""

from __future__ import annotations

import pytest

from stream_dedup.core.normalize import NORMALIZER_VERSION, normalize


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３", "fullwidth abc123"),  # NFKC: compatibility forms
        ("ﬁne ﬂow", "fine flow"),  # NFKC: ligatures
        ("x² ① ½", "x2 1 1⁄2"),  # NFKC: super/circled digits, vulgar fraction
        ("e\u0301te\u0301", "été"),  # NFKC composes combining accents
        ("Straße ΣΊΣΥΦΟΣ", "strasse σίσυφοσ"),  # casefold, not lower()
        ("HELLO World", "hello world"),
    ],
)
def test_nfkc_and_casefold(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  a  b\t\tc\n\nd \r\n e  ", "a b c d e"),
        ("a\u00a0\u2003b\u3000c", "a b c"),  # no-break, em and ideographic spaces
        ("line one\nline two", "line one line two"),
        ("\x0b\x0c a \x1c\x85", "a"),
        ("no-change", "no-change"),
    ],
)
def test_whitespace_collapsed_and_stripped(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize("raw", ["", " ", "\n\t \u00a0\u3000"])
def test_blank_text_normalises_to_empty(raw: str) -> None:
    assert normalize(raw) == ""


def test_idempotent_on_real_text() -> None:
    raw = "  Affitto  STUDIO\tvicino metro A — possibilitÃ  di parcheggio  "
    once = normalize(raw)
    assert once == "affitto studio vicino metro a — possibilitã di parcheggio"
    assert normalize(once) == once


def test_version_constant() -> None:
    assert isinstance(NORMALIZER_VERSION, int)
    assert NORMALIZER_VERSION >= 1
