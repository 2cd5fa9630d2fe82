"""Chunking: passages cut into pieces within a size budget, offsets exact to the character.

Prose is chunked by whole sentences (:func:`sentence_spans`, :func:`chunk_text`),
Markdown along its sections (:func:`section_chunks`,
:mod:`nest_integrations.corpus.markdown_structure`); :func:`chunk_passages`
cuts passages so that ``doc.text[p.doc_char_start:p.doc_char_end] == p.text``
for every chunk.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from .markdown_structure import Block, has_structure, is_markdown, looks_like_markdown, parse_blocks
from .passages import Passage, check_unique_ids

logger = logging.getLogger(__name__)

#: A token counter: ``str -> int`` (or ``str -> sized sequence of tokens``), or an
#: object with a Hugging Face style ``encode(text, add_special_tokens=False)``.
TokenCounter = Any

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


def _opens_a_line(text: str, match: re.Match[str]) -> bool:
    """Whether a sentence end is the two periods that open a line of reStructuredText's explicit
    markup (``.. code-block:: python``, ``.. _label:``), which goes on after them (a doctest's
    ``...`` stays an end)."""
    line_start = text.rfind("\n", 0, match.start()) + 1
    return match.group() == ".." and not text[line_start : match.start()].strip()


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character ranges of the sentences of ``text``, whitespace-trimmed, in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        if _opens_a_line(text, match):
            continue
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
    own is split at word boundaries. Ranges exclude surrounding whitespace, except
    that in a structured text (reStructuredText, Markdown: :func:`~nest_integrations.corpus.markdown_structure.has_structure`)
    a chunk's first line keeps its indentation (:func:`_from_line_start`);
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
    chunks = _pack(text, _sentence_pieces(text, (0, len(text)), cost, budget), cost, budget)
    return [(_from_line_start(text, start), end) for start, end in chunks] if has_structure(text) else chunks


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


def _from_line_start(text: str, start: int) -> int:
    """``start``, or the start of its line when only spaces and tabs come before it there. A
    chunk cut inside an indented code block opens with one of its lines: without its
    indentation that line would read as the text's own (a shell ``# comment`` as a heading,
    a console table's ``----`` as a title's underline) and the block as no code at all."""
    line_start = text.rfind("\n", 0, start) + 1
    return line_start if not text[line_start:start].strip(" \t") else start


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
    """Cut a Markdown text along its sections within a size budget (same knobs as :func:`chunk_text`);
    a reStructuredText one is cut along its titles the same way
    (:func:`~nest_integrations.corpus.markdown_structure.parse_blocks`).

    A section (a heading and everything up to the next heading of its level
    or above) that fits is one chunk, packed with the sibling sections after it
    while they fit; a larger one is cut into its sub-sections the same way,
    and a section without sub-sections into whole blocks (paragraphs, list
    items, code blocks, tables). Only a block over the budget on its own is
    cut: a code block or table at line ends, any other block by sentences. A
    heading never ends a chunk when what follows it fits beside it. Ranges
    exclude surrounding blank lines and trailing white space, but a chunk's first
    line keeps its indentation (:func:`_from_line_start`); ``text[c.start:c.end]``
    is the exact text.

    Returns:
        :class:`TextChunk` in document order; ``[]`` for blank text.
    """
    cost, budget = _budget(max_words, max_tokens, tokenizer)
    blocks = parse_blocks(text)
    if not blocks:
        return []
    return [
        TextChunk(_from_line_start(text, s), e, _shared_path(blocks, s, e)) for s, e in _section_pieces(text, blocks, cost, budget)
    ]


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
    check_unique_ids(chunked)
    return chunked
