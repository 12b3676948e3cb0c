"""Text normalisation: the first step that makes two copies of a story compare equal.

The version number is persisted in the index: changing what ``normalize`` returns for any
input changes shingles and signatures, so it must come with a version bump.
"""

from __future__ import annotations

import unicodedata

NORMALIZER_VERSION = 1


def normalize(text: str) -> str:
    """NFKC, ``str.casefold``, every run of whitespace collapsed to one space, stripped.

    >>> normalize("  Ｆｕｌｌ\\u00a0 width\\nHELLO  ")
    'full width hello'
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())
