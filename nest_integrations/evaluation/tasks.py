"""Evaluation tasks: build lists of :class:`EvalItem` from offline data.

Three tasks are registered in :data:`TASKS`:

* ``"bio"`` (:func:`bio_items`): "Tell me a bio of X." for people sampled from
  the bundled Wikipedia lead summaries; the summary is the reference.
* ``"completion"`` (:func:`completion_items`): continue a summary from its
  first sentence(s); the rest of the summary is the reference.
* ``"qa"`` (:func:`qa_items`): open questions from a JSONL file, scored by
  answer recall.

Sampling is deterministic: candidates are sorted by passage id and drawn with
``random.Random(seed)``, so the same seed and pool give the same items.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nest_integrations.corpus import Passage, load_wikipedia_summaries

__all__ = [
    "EvalItem",
    "TASKS",
    "bio_items",
    "completion_items",
    "get_task",
    "is_person_title",
    "qa_items",
    "split_sentences",
]

logger = logging.getLogger(__name__)

BIO_TOPIC = "People"
BIO_PROMPT = "Tell me a bio of {name}."

# Descriptions of group entries in the "People" topic ("English rock band",
# "American comedy team", "Jewish noble banking family").
_GROUP_DESCRIPTION_RE = re.compile(
    r"\b(?:band|group|duo|trio|quartet|team|family|brothers|sisters)\b", re.IGNORECASE
)
_GROUP_TITLE_WORDS = frozenset({"and", "&", "brothers", "family", "sisters"})

# Words after which a full stop does not end a sentence.
_ABBREVIATIONS = frozenset(
    {"al", "approx", "c", "ca", "cf", "col", "dr", "e.g", "etc", "fr", "ft", "gen", "i.e",
     "jr", "lt", "mr", "mrs", "ms", "mt", "no", "prof", "rev", "sgt", "sr", "st", "vs"}
)
# Candidate boundary: terminal punctuation, optional closing quotes/brackets,
# whitespace, then something that can start a sentence.
_BOUNDARY_RE = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(\s+)(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


@dataclass
class EvalItem:
    """One evaluation example.

    Attributes:
        id: unique, stable id within a task (e.g. ``"bio/Marie Curie"``).
        prompt: text given to the generator (a chat turn unless
            ``meta["chat"]`` is False, in which case a plain-text prefix).
        query: retrieval query for the datastore.
        reference: gold text for overlap metrics (``""`` for QA).
        meta: task-specific extras (``name``, ``passage_id``, ``answers``, ...).
    """

    id: str
    prompt: str
    query: str
    reference: str
    meta: dict[str, Any] = field(default_factory=dict)


def _check_n(n: int) -> None:
    """Raise ValueError unless ``n`` is a non-negative int."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


def _sample(candidates: Sequence[Passage], n: int, seed: int, what: str) -> list[Passage]:
    """Deterministically draw ``n`` passages (sorted by id, then ``Random(seed).sample``).

    Raises:
        ValueError: if fewer than ``n`` candidates are available.
    """
    if n > len(candidates):
        raise ValueError(
            f"asked for {n} {what} items but only {len(candidates)} candidates qualify"
        )
    ordered = sorted(candidates, key=lambda p: p.id)
    return random.Random(seed).sample(ordered, n)


def is_person_title(title: str, description: str = "") -> bool:
    """Whether a "People" summary title looks like one person's plain name.

    Rules (documented heuristics):

    * no parentheses, commas or digits -- excludes disambiguated or styled
      titles ("Hans Krebs (biochemist)", "Charles V, Holy Roman Emperor",
      "14th Dalai Lama");
    * at least two words -- single-token titles are often mononyms, bands or
      ambiguous ("Prince", "ABBA", "Ambrose");
    * no leading "The" and no group words ("and", "&", "brothers", "family",
      "sisters") as whole words, case-insensitive -- excludes "The Doors",
      "Laurel and Hardy", "Marx Brothers" but keeps "Peter the Great";
    * ``description`` (Wikipedia short description, may be empty) does not name
      a group ("rock band", "comedy duo", "banking family", ...).
    """
    if re.search(r"[(),\d]", title):
        return False
    words = title.split()
    if len(words) < 2 or words[0] == "The":
        return False
    if any(w.lower() in _GROUP_TITLE_WORDS for w in words):
        return False
    return not _GROUP_DESCRIPTION_RE.search(description)


def bio_items(n: int, seed: int = 0, passages: list[Passage] | None = None) -> list[EvalItem]:
    """Biography prompts for ``n`` people sampled from Wikipedia lead summaries.

    Args:
        n: number of items (``0`` gives ``[]``).
        seed: sampling seed; same seed and pool -> same items in the same order.
        passages: candidate pool; defaults to
            ``load_wikipedia_summaries(topic="People")``. Passages whose
            ``metadata["topic"]`` is set (non-empty) to something other than
            "People" (case-insensitive) are skipped; the name is ``title``
            (or ``id`` when the title is empty) and must pass
            :func:`is_person_title` (with ``metadata["description"]``).

    Returns:
        Items with prompt ``"Tell me a bio of {name}."``, query = name,
        reference = the summary text and meta ``{"name", "passage_id",
        "chat": True}``.

    Raises:
        ValueError: if ``n < 0`` or fewer than ``n`` people qualify.
    """
    _check_n(n)
    pool = load_wikipedia_summaries(topic=BIO_TOPIC) if passages is None else passages
    candidates = [
        p for p in pool
        if str(p.metadata.get("topic") or BIO_TOPIC).casefold() == BIO_TOPIC.casefold()
        and p.text.strip()
        and is_person_title(p.title or p.id, str(p.metadata.get("description") or ""))
    ]
    logger.debug("bio_items: %d of %d passages qualify", len(candidates), len(pool))
    items = []
    for passage in _sample(candidates, n, seed, "bio"):
        name = passage.title or passage.id
        items.append(
            EvalItem(
                id=f"bio/{passage.id}",
                prompt=BIO_PROMPT.format(name=name),
                query=name,
                reference=passage.text,
                meta={"name": name, "passage_id": passage.id, "chat": True},
            )
        )
    return items


def _is_boundary(text: str, punct_index: int) -> bool:
    """Whether the terminal punctuation at ``text[punct_index]`` ends a sentence.

    A full stop after an initial ("Arthur C. Clarke", "U.S.") or a known
    abbreviation ("St.", "c.", "Dr.") does not end a sentence.
    """
    if text[punct_index] != ".":
        return True
    word_start = punct_index
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:punct_index].lstrip("\"'(\u201c\u2018").lower()
    if len(word) == 1 and word.isalpha():
        return False
    return word not in _ABBREVIATIONS and not re.fullmatch(r"(?:[a-z]\.)+[a-z]", word)


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character ranges ``(start, end)`` of the sentences in ``text``.

    Heuristic splitter: a sentence ends at ``.``, ``!`` or ``?`` (plus closing
    quotes/brackets) followed by whitespace and an upper-case letter, digit or
    opening quote; full stops after initials and common abbreviations do not
    split. Ranges exclude the whitespace between sentences, so
    ``text[end_i:start_{i+1}]`` is that whitespace. Leading/trailing
    whitespace of ``text`` is excluded; an all-whitespace text gives ``[]``.
    """
    stripped = text.strip()
    if not stripped:
        return []
    offset = len(text) - len(text.lstrip())
    end_of_text = offset + len(stripped)
    ranges = []
    start = offset
    for match in _BOUNDARY_RE.finditer(text, offset, end_of_text):
        if not _is_boundary(text, match.start()):
            continue
        ranges.append((start, match.start(1)))
        start = match.end(1)
    ranges.append((start, end_of_text))
    return ranges


def completion_items(
    n: int,
    seed: int = 0,
    passages: list[Passage] | None = None,
    prefix_sentences: int = 1,
    min_continuation_words: int = 15,
) -> list[EvalItem]:
    """Plain-text continuation prompts built from Wikipedia lead summaries.

    The first ``prefix_sentences`` sentences (see :func:`split_sentences`) are
    the prompt and query; the rest of the summary is the reference, so
    ``prompt + separator + reference == passage.text`` where the separator is
    the original whitespace between the sentences.

    Args:
        n: number of items (``0`` gives ``[]``).
        seed: sampling seed (deterministic, as in :func:`bio_items`).
        passages: candidate pool; defaults to ``load_wikipedia_summaries()``.
        prefix_sentences: number of leading sentences in the prompt (>= 1).
        min_continuation_words: only summaries whose continuation has at least
            this many whitespace-separated words qualify.

    Returns:
        Items with meta ``{"chat": False, "passage_id", "title",
        "prefix_sentences"}``.

    Raises:
        ValueError: if ``n < 0``, ``prefix_sentences < 1``,
            ``min_continuation_words < 1`` or fewer than ``n`` summaries qualify.
    """
    _check_n(n)
    if prefix_sentences < 1:
        raise ValueError(f"prefix_sentences must be >= 1, got {prefix_sentences}")
    if min_continuation_words < 1:
        raise ValueError(f"min_continuation_words must be >= 1, got {min_continuation_words}")
    pool = load_wikipedia_summaries() if passages is None else passages
    splits: dict[str, tuple[str, str]] = {}
    candidates = []
    for passage in pool:
        sentences = split_sentences(passage.text)
        if len(sentences) <= prefix_sentences:
            continue
        prefix = passage.text[sentences[0][0] : sentences[prefix_sentences - 1][1]]
        continuation = passage.text[sentences[prefix_sentences][0] : sentences[-1][1]]
        if len(continuation.split()) < min_continuation_words:
            continue
        splits[passage.id] = (prefix, continuation)
        candidates.append(passage)
    logger.debug("completion_items: %d of %d passages qualify", len(candidates), len(pool))
    items = []
    for passage in _sample(candidates, n, seed, "completion"):
        prefix, continuation = splits[passage.id]
        items.append(
            EvalItem(
                id=f"completion/{passage.id}",
                prompt=prefix,
                query=prefix,
                reference=continuation,
                meta={
                    "chat": False,
                    "passage_id": passage.id,
                    "title": passage.title,
                    "prefix_sentences": prefix_sentences,
                },
            )
        )
    return items


def _parse_qa_line(line: str, where: str) -> tuple[str | None, str, list[str]]:
    """Parse one JSONL record into ``(id or None, question, answers)``.

    Raises:
        ValueError: naming ``where`` (path:line) for invalid JSON, a non-object,
            a missing/empty ``question`` string, or ``answers`` that is not a
            non-empty list of non-empty strings.
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: 'question' must be a non-empty string")
    answers = record.get("answers")
    if (
        not isinstance(answers, list)
        or not answers
        or not all(isinstance(a, str) and a.strip() for a in answers)
    ):
        raise ValueError(f"{where}: 'answers' must be a non-empty list of non-empty strings")
    raw_id = record.get("id")
    return (None if raw_id is None else str(raw_id)), question.strip(), answers


def qa_items(path: str | Path) -> list[EvalItem]:
    """Question-answering items from a JSONL file.

    Each non-blank line is ``{"question": str, "answers": [str, ...], "id"?: any}``.
    The prompt and query are the question, the reference is ``""`` and meta is
    ``{"answers": [...], "chat": True}``. Missing ids become ``"qa/{line}"``
    (1-based line number).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: on a malformed line (message gives ``path:line``), a
            duplicate id, or a file without records.
    """
    path = Path(path)
    items: list[EvalItem] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            raw_id, question, answers = _parse_qa_line(line, where)
            item_id = raw_id if raw_id is not None else f"qa/{line_number}"
            if item_id in seen:
                raise ValueError(f"{where}: duplicate id {item_id!r}")
            seen.add(item_id)
            items.append(
                EvalItem(
                    id=item_id,
                    prompt=question,
                    query=question,
                    reference="",
                    meta={"answers": answers, "chat": True},
                )
            )
    if not items:
        raise ValueError(f"{path}: no QA records found")
    return items


TASKS: dict[str, Callable[..., list[EvalItem]]] = {
    "bio": bio_items,
    "completion": completion_items,
    "qa": qa_items,
}


def get_task(name: str) -> Callable[..., list[EvalItem]]:
    """The item builder registered under ``name`` in :data:`TASKS`.

    Raises:
        ValueError: for an unknown name, listing the available task names.
    """
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(sorted(TASKS))}") from None
