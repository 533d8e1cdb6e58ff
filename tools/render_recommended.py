"""Render the recommended-configuration table of docs/cross-round.md from
:func:`fedshield.crossround.recommended.markdown_table` (the stored measurement):
``PYTHONPATH=src python tools/render_recommended.py`` (tests/test_recommended.py checks it)."""

from __future__ import annotations

import re
from pathlib import Path

from fedshield.crossround.recommended import markdown_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "cross-round.md"
BEGIN, END = "<!-- recommended-table -->", "<!-- recommended-table end -->"


def render(text: str) -> str:
    block = f"{BEGIN}\n{markdown_table()}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + r"(?:.*?" + re.escape(END) + r")?", re.S)
    return pattern.sub(lambda _: block, text, count=1)


def main() -> None:
    DOC.write_text(render(DOC.read_text()))


if __name__ == "__main__":
    main()
