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
* **Answer focus** (:func:`focus_windows`): for a question, the sentences of the
  kept passages that share the most (rarest) words with it, each extended while
  it is shorter than ``MIN_WINDOW_WORDS``, taking in the line that heads it (a
  function's signature, a term, a title) and, in Markdown, the whole blocks it
  touches; the question's names that a kept passage opens with are left out of
  the score (:func:`naming_words`), and a question for a year wants a window
  that holds one. The decoder copies the best ``NestConfig.answer_windows`` of
  them in turn and ends the answer when the last one is copied
  (``NestConfig.answer_focus``; only where it ends a sentence or a line:
  :func:`closes_answer`), instead of running on into what the passage says
  next; a window that holds none of the question's other words
  (:attr:`Window.answers` false) only opens the answer.

All offsets are character offsets into a passage's text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.markdown_structure import copy_layout, readable_blocks, start_allowed
from nest_integrations.corpus.passages import Passage, sentence_spans
from .relevance import content_words, is_name_query, names_subject, opening_words, query_names, stem, text_stems
from .words import folded_words

CONTINUATION_WORDS = 2
"""Words of the text so far that must precede a mid-sentence copy in its source."""

REPEAT_CHARS = 24
"""A copy whose first this many characters the text so far already holds is refused (no repeats)."""

MIN_WINDOW_WORDS = 12
"""An answer window shorter than this takes in the following sentence too."""

MAX_BLOCK_WINDOW_WORDS = 120
"""A Markdown answer window takes in the whole blocks it touches up to this many words
(:func:`_whole_blocks`): longer paragraphs or code blocks keep the sentence window."""

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
    """Characters ``[start, end)`` of passage ``passage_id`` that answer the query, with their score.

    ``answers``: whether the window holds a word of the query other than the names that
    single out its passage (:func:`naming_words`). When it does not (no window does), the
    window is only where the answer opens: the copy goes on past it rather than stopping
    before the text that answers."""

    passage_id: str
    start: int
    end: int
    score: float
    answers: bool = True


FOCUS_CANDIDATES = 8
"""Windows, best by word overlap, that the dense similarity re-ranks."""


def _windows(passage: Passage) -> list[tuple[int, int, int]]:
    """``(start, sentence_end, end)`` of one candidate answer window per sentence of
    ``passage``: from the line heading the sentence (:func:`_is_heading`) to the
    sentence's end, then extended over the following sentences while it has fewer
    than ``MIN_WINDOW_WORDS`` words (and no heading intervenes). Windows are scored on ``[start, sentence_end)``."""
    spans = sentence_spans(passage.text)
    windows = []
    for i, (start, end) in enumerate(spans):
        if i and _is_heading(passage.text, *spans[i - 1], start):
            start = spans[i - 1][0]
        core_end, j = end, i
        # Never past Markdown a copy cannot cross (a heading): the window's end would be out of reach.
        while len(folded_words(passage.text[start:end])) < MIN_WINDOW_WORDS and j + 1 < len(spans) and start_allowed(passage.text, spans[j + 1][0]):
            j += 1
            end = spans[j][1]
        windows.append((start, core_end, end))
    return windows


def focus_window(query: str, passages: Sequence[Passage], similarity: Relevance | None = None) -> Window | None:
    """The window of the kept passages that best answers ``query``, or None when none shares a
    word with it: the first of :func:`focus_windows`."""
    windows = focus_windows(query, passages, similarity, count=1)
    return windows[0] if windows else None


def focus_windows(query: str, passages: Sequence[Passage], similarity: Relevance | None = None, *, count: int = 1) -> list[Window]:
    """Up to ``count`` windows of the kept passages that best answer ``query``, best first, none
    overlapping another; empty when none shares a word with it.

    Each sentence's window (:func:`_windows`) scores the sum of
    ``log(1 + N / n_w)`` over the query's content words ``w`` it contains,
    where ``N`` is the number of windows and ``n_w`` those containing ``w``: a
    word every window has (the topic of the document) counts little, the one
    that singles out the answer counts most. With ``similarity`` (the dense
    embedder), the ``FOCUS_CANDIDATES`` best windows are re-ranked by that
    score relative to the best one plus their cosine to the query (lexical
    overlap alone ties "load(fp)" with "dump(obj, fp)" for "write JSON into a
    file"); a follow-up's cosine is the mean of its cosines to the conversation
    and to its last question, so "How do I check later that it exists?" after a
    question about adding a function is not ranked by the first question alone.
    A later window stays with the subject of the first: when the first window's
    passage opens with names the question gives ("Marie Curie"), a later window
    comes only from passages that open with them too, not from another person's
    summary that mentions her (:func:`~.relevance.names_subject`). Ties go to the earlier passage (retrieval order) and window. A
    Markdown window then takes in the whole blocks it touches (:func:`_whole_blocks`).
    """
    wanted = content_words(query)
    if not wanted:
        return []
    windows = [(p, s, e, text_stems(p.text[s:core])) for p in passages for s, core, e in _windows(p)]
    if asks_year(query):  # only windows that hold a year can answer "which year"
        asked = set(_YEAR.findall(query))
        dated = [w for w in windows if set(_YEAR.findall(w[0].text[w[1] : w[2]])) - asked]
        windows = dated or windows
    naming = naming_words(query, passages)
    topical = wanted - naming
    # A follow-up's query is the conversation's questions, one a line
    # (conversation.retrieval_query): the last one says what is asked now.
    last_question = query.strip().splitlines()[-1]
    asked_now = content_words(last_question) - naming
    if asked_now != topical and any(asked_now & words for *_, words in windows):
        topical = asked_now
    answers = bool(topical) and any(topical & words for *_, words in windows)
    if answers:
        wanted = topical
    counts = {w: sum(w in words for *_, words in windows) for w in wanted}
    weight = {w: math.log1p(len(windows) / n) for w, n in counts.items() if n}
    scores = [sum(weight.get(w, 0.0) for w in wanted & words) for *_, words in windows]
    ranked = sorted((i for i, score in enumerate(scores) if score > 0), key=lambda i: -scores[i])[:FOCUS_CANDIDATES]
    if similarity is not None and len(ranked) > 1:
        texts = [windows[i][0].text[windows[i][1] : windows[i][2]] for i in ranked]
        cosines = similarity(query, texts)
        if last_question != query.strip():
            cosines = [(whole + last) / 2 for whole, last in zip(cosines, similarity(last_question, texts))]
        combined = {i: scores[i] / scores[ranked[0]] + float(c) for i, c in zip(ranked, cosines)}
        ranked = sorted(ranked, key=lambda i: (-combined[i], i))
    chosen: list[Window] = []
    taken: list[tuple[str, int, int]] = []  # (document, start, end) of the chosen windows
    names = query_names(query)
    subjects: list[str] = []  # the question's names the first window's passage opens with
    for i in ranked:
        passage, start, end, _ = windows[i]
        if subjects and not all(names_subject(name, passage.text, whole_sentence=True) for name in subjects):
            continue  # a later window stays with the person or thing the first one is about
        start, end = _whole_blocks(passage.text, start, end)
        here = _in_document(passage, start, end)
        if any(doc == here[0] and s < here[2] and here[1] < e for doc, s, e in taken):
            continue  # the same characters, also through a chunk that overlaps the first's: no repeats
        chosen.append(Window(passage.id, start, end, scores[i], answers or not topical))
        taken.append(here)
        if len(chosen) == 1:
            subjects = [name for name in names if names_subject(name, passage.text, whole_sentence=True)]
        if len(chosen) == count:
            break
    return chosen


def _in_document(passage: Passage, start: int, end: int) -> tuple[str, int, int]:
    """``(document, start, end)`` of characters ``[start, end)`` of ``passage`` in its document
    (``doc_id`` and ``doc_char_start``; the passage itself when it has no document). Chunk
    splitters overlap their chunks (LangChain's and LlamaIndex's by 200 characters), so one
    sentence can be a window in two passages: in document offsets the two windows overlap."""
    if not passage.doc_id:
        return passage.id, start, end
    return passage.doc_id, passage.doc_char_start + start, passage.doc_char_start + end


def _whole_blocks(text: str, start: int, end: int) -> tuple[int, int]:
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


def closes_answer(text: str, end: int) -> bool:
    """Whether an answer copied up to character ``end`` of ``text`` ends a sentence or a line
    (a list item, a code line, the text's end) with every bracket it opened closed within the
    line: only then may it stop as answered. "... (e.g." and "as follows:" do not."""
    line_start = text.rfind("\n", 0, end) + 1
    line = text[line_start:end].rstrip()
    if unclosed_brackets(line) - line.count('"') % 2 > 0 or line.endswith(":"):
        return False
    return not text[end:].strip(" \t") or text[end:].lstrip(" \t").startswith("\n") or ends_sentence(line)


_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})\b")
_ASKS_YEAR = re.compile(r"^\s*when\b|\b(?:what|which) year\b", re.IGNORECASE)


def asks_year(query: str) -> bool:
    """Whether ``query`` asks for a year or a date ("When did...", "In which year...")."""
    return bool(_ASKS_YEAR.search(query))


def naming_words(query: str, passages: Sequence[Passage]) -> set[str]:
    """Stems of the query's names (capitalised words after its first) that a kept passage
    opens with (:func:`~nest_integrations.policy.relevance.opening_words`): "Galileo Galilei" in
    "In which city was Galileo Galilei born?". They tell which passage answers, not where
    in it: every sentence about Galileo is about Galileo, and the opening sentence, which
    names him in full, would otherwise win over "He was born in Pisa"."""
    names = content_words(" ".join(re.findall(r"(?<=\s)[A-Z][\w'’.-]*", query)))
    opened = {stem(w) for p in passages for w in opening_words(p.text)}
    return names & opened
