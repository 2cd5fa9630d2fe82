"""Where a copy may start and which part of a passage answers the query (beyond the paper).

The paper copies from whichever neighbour the kNN search ranks first. Over a
user's documents that reads badly: copies start mid-sentence after the LM's
first words ("Ada Lovelace, was an English..."), inside a parenthesis
("1912), which gave its name to..."), and a question is answered by copying
a whole passage from its first word to its last. Two small rules fix that:

* **Seams** (:func:`acceptable_start`): a copy may start at a sentence start
  of its source when the text so far is empty or ends a sentence, and
  otherwise only where the source really continues the text so far (its last
  ``CONTINUATION_WORDS`` words precede the copy in the source too) and not
  inside a bracket or quotation the text so far never opened; never to
  repeat what the text so far already says. In Markdown, never inside markup
  a reader does not see, and inside a code block only at a line's start
  (:func:`~nest_integrations.corpus.markdown_structure.start_allowed`).
* **Answer windows** (:func:`sentence_windows`, :func:`whole_blocks`): the candidates a
  question's answer is copied from: each sentence of a passage, extended while it is
  shorter than ``MIN_WINDOW_WORDS``, taking in the line that heads it (a function's
  signature, a term, a title) and, in Markdown, the whole blocks it touches. Which of them
  answer is decided by a fitted model (:mod:`~nest_integrations.policy.selection`); the
  decoder copies the best ``NestConfig.answer_windows`` of them in turn and ends the answer
  when the last one is copied (``NestConfig.answer_focus``; only where it ends a sentence or
  a line: :func:`closes_answer`), instead of running on into what the passage says next.

All offsets are character offsets into a passage's text.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass
from typing import Sequence

from nest_integrations.corpus.chunking import sentence_spans
from nest_integrations.corpus.markdown_structure import copy_layout, parse_blocks, readable_blocks, shows_text, start_allowed
from nest_integrations.corpus.passages import Passage
from nest_integrations.corpus.rst_structure import announces_code
from .relevance import is_name_query
from .words import folded_words

CONTINUATION_WORDS = 2
"""Words of the text so far that must precede a mid-sentence copy in its source."""

REPEAT_CHARS = 24
"""A copy whose first this many characters the text so far already holds is refused (no repeats)."""

MIN_WINDOW_WORDS = 12
"""An answer window shorter than this takes in the following sentence too."""

MAX_BLOCK_WINDOW_WORDS = 120
"""A Markdown answer window takes in the whole blocks it touches up to this many words
(:func:`whole_blocks`): longer paragraphs or code blocks keep the sentence window."""

_ANNOUNCING = re.compile(r"(?::|\b[eE]\.g\.|\b[iI]\.e\.)$")
"""A line's end that announces what follows: a colon, or "e.g." / "i.e." (no sentence ends there)."""
_OPENERS = {"(": ")", "[": "]", "\u201c": "\u201d", "\u2018": "\u2019"}
_QUESTION_WORDS = frozenset(
    "how what which who whom whose when where why is are was were do does did can could should would will shall "
    "may might has have had".split()
)




def ends_sentence(text: str) -> bool:
    """Whether ``text`` is empty or ends a sentence, a heading or a list item."""
    stripped = text.rstrip(" \t\"'\u201d\u2019)]")
    return not stripped or stripped[-1] in ".!?:\n" or text.endswith("\n")


def unclosed_brackets(text: str) -> int:
    """Brackets and curly quotes opened in ``text`` and not closed, plus 1 for an odd count of ``"``."""
    depth = 0
    for ch in text:
        if ch in _OPENERS:
            depth += 1
        elif ch in _OPENERS.values():
            depth = max(depth - 1, 0)
    return depth + text.count('"') % 2


def _sentence_start_before(source: str, char_pos: int, starts: Sequence[int]) -> int:
    return max((s for s in starts if s <= char_pos), default=0)


def continues(generated: str, source: str, char_pos: int) -> bool:
    """Whether ``source[char_pos:]`` really continues ``generated``: the source's last
    ``CONTINUATION_WORDS`` words before ``char_pos`` are the last words written, and
    ``char_pos`` does not split a word."""
    wanted = folded_words(generated)[-CONTINUATION_WORDS:]
    before = source[:char_pos]
    splits_word = bool(before) and before[-1].isalnum() and source[char_pos : char_pos + 1].isalnum()
    return bool(wanted) and folded_words(before)[-len(wanted) :] == wanted and not splits_word


def acceptable_start(generated: str, source: str, char_pos: int, starts: Sequence[int]) -> bool:
    """Whether a copy of ``source[char_pos:]`` may follow ``generated`` (see the module docstring).

    Args:
        generated: the text generated so far.
        source: the source passage's text.
        char_pos: where the copy would start (a token's start: it may point at
            the whitespace before the token's word).
        starts: the sentence starts of ``source`` (:func:`sentence_starts`).
    """
    begin = char_pos + len(source[char_pos:]) - len(source[char_pos:].lstrip())
    if begin < len(source) and not start_allowed(source, begin):
        return False  # Markdown: inside hidden markup, or mid-line in a code block
    ahead = source[begin : begin + REPEAT_CHARS]
    if len(ahead) == REPEAT_CHARS and ahead in generated:
        return False  # the text so far already says this (a completion prompt's own first sentence)
    if ends_sentence(generated):
        return begin in starts or begin == 0
    if not continues(generated, source, char_pos):
        return False
    sentence = source[_sentence_start_before(source, char_pos, starts) : char_pos]
    return unclosed_brackets(sentence) <= unclosed_brackets(generated)


def sentence_starts(text: str) -> list[int]:
    """Character offsets where the sentences of ``text`` start (0 included when text starts one), sorted.

    In Markdown (:func:`~nest_integrations.corpus.markdown_structure.copy_layout`) the
    first character of every readable block is a start too, a code block's
    only starts are its lines' first characters, and hidden markup (a heading
    line, a comment, ...) has none.
    """
    starts = [start for start, _ in sentence_spans(text)]
    layout = copy_layout(text)
    if layout is None:
        return starts
    extra = [*layout.block_starts, *layout.code_line_starts]
    return sorted({s for s in starts if start_allowed(text, s)} | set(extra))


def is_question(query: str) -> bool:
    """Whether ``query`` asks a question (a question mark, or a question word first). Requests
    ("Tell me a bio of...", "Explain...") are not questions: they want more than one sentence."""
    words = folded_words(query)
    return "?" in query or bool(words and words[0] in _QUESTION_WORDS)


def wants_focus(query: str) -> bool:
    """Whether answers to ``query`` should be focused on one window (questions, not bare names)."""
    return bool(query.strip()) and not is_name_query(query) and is_question(query)


def _is_heading(text: str, start: int, end: int, next_start: int) -> bool:
    """Whether ``text[start:end]`` is a line heading what follows it (a title, a
    function signature, a term being defined): it ends without terminal
    punctuation and a line break separates it from ``next_start``."""
    return "\n" in text[end:next_start] and not text[start:end].rstrip().endswith((".", "!", "?"))


@dataclass(frozen=True)
class Window:
    """Characters ``[start, end)`` of passage ``passage_id`` chosen to answer the query, with the
    probability that they hold the answer (:meth:`~.selection.AnswerSelector.probabilities`)."""

    passage_id: str
    start: int
    end: int
    score: float


def sentence_windows(passage: Passage) -> list[tuple[int, int, int]]:
    """``(start, sentence_end, end)`` of one candidate answer window per sentence of
    ``passage``: from the line heading the sentence (:func:`_is_heading`) to the
    sentence's end, then extended over the following sentences while it has fewer
    than ``MIN_WINDOW_WORDS`` words (and no heading intervenes). Windows are scored on ``[start, sentence_end)``.
    A sentence that opens a section (a heading's title) takes in no line of the section before: its
    last list item or code line is no term that heads it."""
    spans = sentence_spans(passage.text)
    layout = copy_layout(passage.text)
    headings = layout.heading_starts if layout is not None else frozenset()
    windows = []
    for i, (start, end) in enumerate(spans):
        opens_section = i and any(spans[i - 1][0] < heading <= start for heading in headings)
        if i and not opens_section and _is_heading(passage.text, *spans[i - 1], start):
            start = spans[i - 1][0]
        core_end, j = end, i
        # Never past Markdown a copy cannot cross (a heading): the window's end would be out of reach.
        while len(folded_words(passage.text[start:end])) < MIN_WINDOW_WORDS and j + 1 < len(spans) and start_allowed(passage.text, spans[j + 1][0]):
            j += 1
            end = spans[j][1]
        windows.append((start, core_end, end))
    return windows


def document_range(passage: Passage, start: int, end: int) -> tuple[str, int, int]:
    """``(document, start, end)`` of characters ``[start, end)`` of ``passage`` in its document
    (``doc_id`` and ``doc_char_start``; the passage itself when it has no document). Chunk
    splitters overlap their chunks (LangChain's and LlamaIndex's by 200 characters), so one
    sentence can be a window in two passages: in document offsets the two windows overlap."""
    if not passage.doc_id:
        return passage.id, start, end
    return passage.doc_id, passage.doc_char_start + start, passage.doc_char_start + end


def whole_blocks(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` widened to the Markdown blocks it touches (a paragraph, a list item, a
    code block), unless they hold more than ``MAX_BLOCK_WINDOW_WORDS`` words; unchanged for prose.

    Documentation states a fact over a paragraph: the sentence that shares the question's words
    ("That way, both /foo and /foo/ point to the same route") often leans on the one before it
    for the name that answers ("set this flag to true"), or the answer ends the paragraph."""
    touched = [(s, e) for s, e in readable_blocks(text) if s < end and e > start]  # none for prose
    if not touched:
        return start, end
    wide = (min(start, touched[0][0]), max(end, touched[-1][1]))
    return wide if len(folded_words(text[wide[0] : wide[1]])) <= MAX_BLOCK_WINDOW_WORDS else (start, end)


def within_section(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` of Markdown ``text`` kept to one section: a window that opens with a heading,
    or with markup a reader does not see and then a heading (a reStructuredText label, an
    ``.. include::`` line), starts below it; one that runs into the next heading ends with the
    last block a reader sees before it. Unchanged for prose; ``start >= end`` when nothing is left.

    A heading's line is never copied (its title is, before the window: ``section_title``), so a
    window over a heading would be chosen for words the answer does not show: the last list item
    of one section copied for the title of the next."""
    layout = copy_layout(text)
    if layout is None:
        return start, end
    while (heading := min((h for h in layout.heading_starts if start <= h < end), default=None)) is not None:
        if shows_text(text, start, heading):
            return start, max((e for s, e in readable_blocks(text) if start < e <= heading), default=start)
        start = next((b.start for b in parse_blocks(text) if b.start > heading and b.kind != "heading"), len(text))
    return start, end


def closes_answer(text: str, end: int) -> bool:
    """Whether an answer copied up to character ``end`` of ``text`` ends a sentence or a line
    (a list item, a code line, the text's end) with every bracket it opened closed within the
    line and nothing announced: only then may it stop as answered. "... (e.g." does not, nor
    a line that announces what follows it: "as follows:", "... from the official repos, e.g.",
    or a directive whose body is code (``.. code-block:: console``, a lone ``::``) with the code
    below it. Such a directive on the next line that shows anything announces its code for the
    paragraph above it ("To get the latest development version, run" over ``.. code-block:: shell``)."""
    line_start = text.rfind("\n", 0, end) + 1
    line = text[line_start:end].rstrip()
    if unclosed_brackets(line) - line.count('"') % 2 > 0 or _ANNOUNCING.search(line) or announces_code(line):
        return False
    if announces_code(text[end:].lstrip().split("\n", 1)[0]):
        return False
    return not text[end:].strip(" \t") or text[end:].lstrip(" \t").startswith("\n") or ends_sentence(line)


@functools.lru_cache(maxsize=256)
def sentence_ends(text: str) -> tuple[int, ...]:
    """Sorted character offsets where the sentences of ``text`` end
    (:func:`~nest_integrations.corpus.chunking.sentence_spans`: terminal punctuation, a blank
    line, a line the next one does not go on from), white space not included. Cached: a decoder
    reads a passage's ends at each copy from it near the token budget (:func:`stops_whole`)."""
    return tuple(end for _, end in sentence_spans(text))


def stops_whole(text: str, end: int) -> bool:
    """Whether an answer copied up to character ``end`` of ``text`` stops with its sentence whole,
    so that a token budget that would cut the sentence after it may end the answer there: a
    sentence of ``text`` ends at ``end`` (:func:`sentence_ends`; white space between them aside),
    the answer closes there (:func:`closes_answer`: nothing announced, no bracket left open), its
    last character is one a reader sees (:func:`~nest_integrations.corpus.markdown_structure.shows_text`:
    not a heading's title, a label with nothing under it), and a sentence that ends the text ends
    in its punctuation (a chunk may be cut mid-sentence)."""
    ends = sentence_ends(text)
    i = bisect.bisect_right(ends, end) - 1
    if i < 0 or text[ends[i] : end].strip() or not closes_answer(text, end):
        return False
    shown = len(text[:end].rstrip())
    if shown == 0 or not shows_text(text, shown - 1, shown):
        return False
    return bool(text[end:].strip()) or text[:shown].rstrip("\"')]\u201d\u2019")[-1:] in (".", "!", "?")
