"""Passages, the unit of a corpus, and their JSON-lines persistence.

A corpus is a ``list[Passage]``. Passages are what the retrievers index and
what the token-level datastore encodes, so every loader
(:mod:`nest_integrations.corpus.loaders`) returns passages with unique ids and
the exact (unnormalised) text of their source, and chunking
(:mod:`nest_integrations.corpus.chunking`) records character offsets that map
each chunk back into its document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

from nest_integrations.core.jsonsafe import json_safe

PathLike = Union[str, Path]

CHUNK_GAP_CHARS = 64
"""Characters a chunker may leave out between two chunks of a document: the white space it strips
at a cut (blank lines, the next line's indentation: up to 35 characters in reStructuredText
manuals). A larger gap means a chunk between the two is missing (removed from a store)."""


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text.

    Attributes:
        id: unique within a corpus.
        text: the passage text, exactly as in the source (no normalisation).
        title: title of the source document ("" when unknown).
        metadata: free-form JSON data (excluded from the hash). numpy values,
            dates and a few other types are converted on creation and anything
            else is refused with a ValueError naming the key
            (:func:`nest_integrations.core.jsonsafe.json_safe`).
        doc_id: id of the document this passage was cut from; "" when the
            passage is the whole document.
        doc_char_start: character offset of ``text`` inside the document's
            text, so ``doc.text[p.doc_char_start:p.doc_char_end] == p.text``.
    """

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    doc_id: str = ""
    doc_char_start: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Passage.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.text, str):
            raise ValueError(f"Passage {self.id!r}: text must be a string, got {type(self.text).__name__}")
        if self.doc_char_start < 0:
            raise ValueError(f"Passage {self.id!r}: doc_char_start must be >= 0, got {self.doc_char_start}")
        if not isinstance(self.metadata, Mapping):
            raise ValueError(f"Passage {self.id!r}: metadata must be a dict, got {type(self.metadata).__name__}")
        try:
            metadata = json_safe(dict(self.metadata))
        except ValueError as err:
            raise ValueError(f"Passage {self.id!r}: {err}") from None
        object.__setattr__(self, "metadata", metadata)

    @property
    def doc_char_end(self) -> int:
        """End offset (exclusive) of ``text`` inside the document's text."""
        return self.doc_char_start + len(self.text)

    def continued_by(self, later: "Passage") -> bool:
        """Whether ``later`` may be the chunk after this one in their document: the same
        ``doc_id`` (not empty), starting after this one starts, and inside it (splitters overlap
        their chunks) or at most :data:`CHUNK_GAP_CHARS` characters after its end. The nearest
        such chunk is the one that goes on from it."""
        return bool(self.doc_id) and later.doc_id == self.doc_id and self.doc_char_start < later.doc_char_start <= self.doc_char_end + CHUNK_GAP_CHARS

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict with every field (``metadata`` is copied)."""
        return {
            "id": self.id,
            "text": self.text,
            "title": self.title,
            "metadata": dict(self.metadata),
            "doc_id": self.doc_id,
            "doc_char_start": self.doc_char_start,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Passage":
        """Inverse of :meth:`to_dict`; ``id`` and ``text`` are required, unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown Passage field(s) {unknown}; expected a subset of {sorted(known)}")
        missing = [name for name in ("id", "text") if name not in d]
        if missing:
            raise ValueError(f"Passage dict is missing required field(s) {missing}")
        return cls(
            id=d["id"],
            text=d["text"],
            title=d.get("title", ""),
            metadata=dict(d.get("metadata", {})),
            doc_id=d.get("doc_id", ""),
            doc_char_start=int(d.get("doc_char_start", 0)),
        )


def check_unique_ids(passages: Sequence[Passage]) -> None:
    """Raise a ValueError naming the first id that two of ``passages`` share."""
    seen: set[str] = set()
    for passage in passages:
        if passage.id in seen:
            raise ValueError(f"duplicate passage id {passage.id!r}")
        seen.add(passage.id)


def save_passages_jsonl(passages: Iterable[Passage], path: PathLike) -> None:
    """Write passages as :meth:`Passage.to_dict` JSON lines (UTF-8); creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for passage in passages:
            handle.write(json.dumps(passage.to_dict(), ensure_ascii=False) + "\n")


def load_passages_jsonl(path: PathLike) -> list[Passage]:
    """Read a file written by :func:`save_passages_jsonl` (exact round trip).

    Raises:
        ValueError: a malformed line (named ``file:line``) or duplicate ids.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        return parse_passages_jsonl(handle, str(path))


def parse_passages_jsonl(lines: Iterable[bytes], where: str) -> list[Passage]:
    """The passages of the lines of a file written by :func:`save_passages_jsonl`, as a binary
    file gives them (a saved index reads its own through a checked stream).

    Raises:
        ValueError: a malformed line (named ``where:line``) or duplicate ids.
    """
    from nest_integrations.core.jsonl import iter_jsonl_lines

    passages = []
    for line_no, record in iter_jsonl_lines(lines, where):
        try:
            passages.append(Passage.from_dict(record))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}:{line_no}: {err}") from err
    check_unique_ids(passages)
    return passages
