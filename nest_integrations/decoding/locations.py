"""Where cited text sits in its document: :func:`locate` reads the passage's source file.

A copied span's :class:`~nest_integrations.decoding.output.SourceLocation` names
its document, the character range there and the lines, so a reader can open the
file at the cited lines. The offsets come from the passage; the lines from the
document's file when it can be read (:func:`document_text`), else from what the
passage knows of itself.
"""

from __future__ import annotations

import functools
import stat
from pathlib import Path
from typing import Optional

from nest_integrations.corpus.loaders import read_document
from nest_integrations.corpus.passages import Passage

from .output import SourceLocation, document_name

START_LINE_FIELD = "start_line"
"""Metadata field a splitter may set: the 1-based line of the document its chunk starts on
(the integrations' Markdown splitters set it next to the chunk's character offset)."""

MAX_DOCUMENT_BYTES = 32 * 2**20
"""Largest document file read to check offsets and count lines (bigger ones: lines unknown)."""


def document_text(name: str) -> Optional[str]:
    """The text of the file ``name`` names (a path, relative to the working directory or absolute),
    read as the loaders read it (:func:`~nest_integrations.corpus.loaders.read_document`: UTF-8,
    a ``.gz`` decompressed, universal newlines); None when it is no readable document of at most
    :data:`MAX_DOCUMENT_BYTES` on disk. Reads are cached while the file is unchanged."""
    try:
        info = Path(name).stat()
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DOCUMENT_BYTES:
        return None
    return _read_document(str(Path(name).resolve()), info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=32)
def _read_document(path: str, mtime_ns: int, size: int) -> Optional[str]:
    """The cached body of :func:`document_text` (``mtime_ns`` and ``size`` only key the cache)."""
    try:
        return read_document(path)
    except (OSError, ValueError):  # ValueError: an UnreadableDocument
        return None


def _offset_in(document: str, passage: Passage) -> Optional[int]:
    """Where ``passage.text`` sits in ``document``: at its claimed ``doc_char_start`` when it is
    there, else at its only occurrence; None when it is absent or ambiguous."""
    if document.startswith(passage.text, passage.doc_char_start):
        return passage.doc_char_start
    first = document.find(passage.text)
    if first < 0 or document.find(passage.text, first + 1) >= 0:
        return None
    return first


def _line_range(text: str, lo: int, hi: int, first_line: int) -> tuple[int, int]:
    """The 1-based lines of ``text[lo:hi]`` when ``text`` starts on line ``first_line``."""
    return first_line + text.count("\n", 0, lo), first_line + text.count("\n", 0, max(hi - 1, lo))


def locate(passage: Passage, char_start: int, char_end: int) -> SourceLocation:
    """Where ``passage.text[char_start:char_end]`` sits in its document.

    The document is named by :func:`~nest_integrations.decoding.output.document_name`.
    Its character offsets come from the passage's ``doc_char_start`` (a LangChain
    chunk's ``start_index``, a LlamaIndex node's ``start_char_idx``, a ``nest index
    build`` passage's own field); a passage without a ``doc_id`` is a whole
    document. Lines come from, in order:

    1. the document's file, when the name is a readable file holding the
       passage text at its offset (or only once: then that occurrence also
       fixes the offsets, e.g. for a chunk split without ``start_index``);
    2. the passage text itself, when the passage is the whole document;
    3. the chunk's :data:`START_LINE_FIELD` metadata plus the newlines before
       the cited text;

    else they are None (unknown).
    """
    name = document_name(passage.metadata, passage.doc_id or passage.id)
    text = document_text(name)
    offset = _offset_in(text, passage) if text is not None else None
    if text is not None and offset is not None:
        lines = _line_range(text, offset + char_start, offset + char_end, 1)
        return SourceLocation(
            document=name, document_id=name, char_start=offset + char_start, char_end=offset + char_end,
            line_start=lines[0], line_end=lines[1],
        )
    whole = passage.doc_id in ("", passage.id) and passage.doc_char_start == 0
    first_line = 1 if whole else passage.metadata.get(START_LINE_FIELD)
    known = isinstance(first_line, int) and not isinstance(first_line, bool) and first_line >= 1
    lines = _line_range(passage.text, char_start, char_end, first_line) if known else (None, None)
    return SourceLocation(
        document=name,
        document_id=passage.doc_id or passage.id,
        char_start=passage.doc_char_start + char_start,
        char_end=passage.doc_char_start + char_end,
        line_start=lines[0],
        line_end=lines[1],
    )
