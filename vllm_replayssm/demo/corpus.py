"""The demo models' training text: English prose from the Python standard library of the
interpreter that runs this (its docstrings, and the language reference topics that `help()`
shows, `pydoc_data.topics`), so that training needs no network and no download.

A document is one paragraph with its whitespace collapsed to single spaces. Only prose is
kept: ASCII paragraphs of at least MIN_CHARS characters, mostly letters and spaces, without
interactive examples (`>>>`). Duplicates are dropped (first occurrence kept) and the order is
fixed (sorted file paths, then source order), so one Python release always gives the same
corpus; its SHA-256 is recorded with the trained weights.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
import sysconfig
from pathlib import Path

MIN_CHARS = 40
MIN_PROSE_FRACTION = 0.85  # letters and spaces over all characters
VAL_EVERY = 20  # every 20th document is held out for the validation loss
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_PARAGRAPH = re.compile(r"\n\s*\n")


def _prose(paragraph: str) -> str | None:
    text = " ".join(paragraph.split())
    if len(text) < MIN_CHARS or not text.isascii() or ">>>" in text:
        return None
    prose = sum(c.isalpha() or c == " " for c in text)
    return text if prose >= MIN_PROSE_FRACTION * len(text) else None


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):  # the stdlib ships a few deliberately broken files
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, kinds))
    return [d for d in docs if d]


def _source_files(stdlib: Path) -> list[Path]:
    files = (p for p in stdlib.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(stdlib).parts))
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix())


@functools.cache
def documents() -> tuple[str, ...]:
    """All corpus documents in their fixed order (about 1.6 MB of text on Python 3.11)."""
    from pydoc_data.topics import topics

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [doc for path in _source_files(stdlib) for doc in _docstrings(path)]
    texts += [topics[name] for name in sorted(topics)]
    seen: dict[str, None] = {}
    for text in texts:
        for paragraph in _PARAGRAPH.split(text):
            prose = _prose(paragraph)
            if prose is not None:
                seen.setdefault(prose)
    return tuple(seen)


def split() -> tuple[list[str], list[str]]:
    """(training documents, validation documents): every VAL_EVERY-th one is held out."""
    docs = documents()
    train = [d for i, d in enumerate(docs) if i % VAL_EVERY]
    return train, list(docs[::VAL_EVERY])


def describe() -> dict[str, object]:
    """What identifies the corpus: source, Python release, size and SHA-256."""
    docs = documents()
    digest = hashlib.sha256("\n".join(docs).encode()).hexdigest()
    return {
        "source": "Python standard library docstrings + pydoc_data.topics (prose paragraphs)",
        "python": ".".join(map(str, sys.version_info[:3])),
        "documents": len(docs),
        "chars": sum(map(len, docs)),
        "sha256": digest,
    }
