"""The real Kijiji rental ads, read from the copy in ``tests/data`` (see its README).

Every test and benchmark that uses the ads reads them here, so they all see the same
texts: the file is read literally (split on tabs and ``"\\n"``, no quote handling, no
newline translation, mojibake kept), because the quality tests compare against ground
truth computed from exactly these strings.
"""

from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path

#: The ads, gzip-compressed TSV with a header row (Title, Short Description, ...).
KIJIJI_TSV_GZ = Path(__file__).resolve().parent / "data" / "kijiji_rent_rome.tsv.gz"
#: Data rows in the file; a different count means the file was changed.
KIJIJI_ADS = 2627


@cache
def kijiji_contents() -> tuple[str, ...]:
    """Title + " " + Short Description of every ad, in file order."""
    with gzip.open(KIJIJI_TSV_GZ, "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    header, rows = lines[0].split("\t"), lines[1:]
    if rows and rows[-1] == "":
        rows.pop()  # the newline that ends the last row
    title, desc = header.index("Title"), header.index("Short Description")
    contents = []
    for row in rows:
        fields = row.split("\t")
        contents.append(fields[title] + " " + fields[desc])
    if len(contents) != KIJIJI_ADS:
        raise AssertionError(f"{KIJIJI_TSV_GZ} has {len(contents)} ads, not {KIJIJI_ADS}")
    return tuple(contents)
