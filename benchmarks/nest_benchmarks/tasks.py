"""Evaluation tasks: build lists of :class:`EvalItem` from offline data.

The tasks registered in :data:`TASKS` (``nest eval --task NAME``):

* ``"bio"`` (:func:`bio_items`): "Tell me a bio of X." for people sampled from
  the bundled Wikipedia lead summaries; the summary is the reference.
  ``nest eval --task bio --n 100`` (present and absent conditions).
* ``"completion"`` (:func:`completion_items`): continue a summary from its
  first sentence(s); the rest of the summary is the reference.
  ``nest eval --task completion --n 20``.
* ``"qa"`` (:func:`qa_items`): open questions from a JSONL file, scored by
  answer recall. ``nest eval --task qa --qa questions.jsonl``.
* ``"wiki-qa"`` (:func:`wiki_qa_items`): questions built from the summaries
  themselves (a person's nationality, profession, birth or death year; where a
  place lies; what a thing is), gold answers verbatim in the gold summary.
  ``nest eval --task wiki-qa --n 100`` (people, the default index);
  ``nest eval --task wiki-qa -d idx/wiki`` over an index of all summaries
  (``nest index build wiki --out idx/wiki``) adds the other topics.
* ``"docs"`` (:func:`docs_items`): hand-written questions about the
  standard-library docstrings of :mod:`.docs_corpus`.
  ``nest eval --task docs`` (whole documents, as ``nest index build`` keeps
  them) or ``nest eval --task docs --docs-chunking splitter`` (LangChain's
  default splitter chunks).
* ``"markdown-docs"`` (:func:`markdown_docs_items`): hand-written questions
  about the Fastify web framework's Markdown reference docs
  (:mod:`.markdown_docs`): how-to questions, follow-ups that need the chat
  history, and questions the docs do not answer.
  ``nest eval --task markdown-docs [--docs-chunking cli|splitter|sentence]``.
* ``"markdown-docs-pino"`` (:func:`markdown_docs_pino_items`): the same kinds of
  questions about a second project's Markdown docs, the Pino logger's API
  reference (a heading per function or option), so that what is measured on
  Fastify is checked on another layout.
  ``nest eval --task markdown-docs-pino [--docs-chunking cli|splitter|sentence]``.
* ``"wiki-qa-hard"`` (:func:`wiki_qa_hard_items`): hand-written factual
  questions about people of the bundled summaries whose answers sit after the
  summary's first sentence, plus questions about people the corpus does not
  hold. ``nest eval --task wiki-qa-hard`` (the default index of the people).

The question tasks (qa, wiki-qa, docs, markdown-docs, markdown-docs-pino, wiki-qa-hard) are scored by answer recall with a
short answer budget by default (:data:`TASK_MAX_NEW_TOKENS`).

Sampling is deterministic: candidates are sorted by id and drawn with
``random.Random(seed)``, so the same seed and pool give the same items.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nest_integrations import NestConfig, Passage, load_wikipedia_summaries
from nest_integrations.core.jsonl import iter_jsonl
from nest_integrations.policy.conversation import retrieval_query

__all__ = [
    "DOCS_QA_PATH",
    "EvalItem",
    "MARKDOWN_QA_KINDS",
    "FILE_TASKS",
    "QA_TASKS",
    "TASKS",
    "TASK_MAX_NEW_TOKENS",
    "WIKI_QA_HARD_PATH",
    "WIKI_QA_KINDS",
    "bio_items",
    "completion_items",
    "docs_items",
    "get_task",
    "is_person_title",
    "markdown_docs_items",
    "markdown_docs_pino_items",
    "markdown_qa_items",
    "qa_items",
    "split_sentences",
    "wiki_qa_hard_items",
    "wiki_qa_items",
    "wiki_questions",
]

logger = logging.getLogger(__name__)

_WithId = TypeVar("_WithId", Passage, "EvalItem")

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
            ``meta["chat"]`` is False, in which case a plain-text prefix), or a
            list of ``{"role", "content"}`` messages ending with the user's
            turn (a follow-up in a conversation).
        query: retrieval query for the datastore.
        reference: gold text for overlap metrics (``""`` for QA).
        meta: task-specific extras (``name``, ``passage_id``, ``answers``, ...).
    """

    id: str
    prompt: str | list[dict[str, str]]
    query: str
    reference: str
    meta: dict[str, Any] = field(default_factory=dict)


def _check_n(n: int) -> None:
    """Raise ValueError unless ``n`` is a non-negative int."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


def _sample(candidates: Sequence[_WithId], n: int, seed: int, what: str) -> list[_WithId]:
    """Deterministically draw ``n`` passages or items (sorted by ``id``, then ``Random(seed).sample``).

    Raises:
        ValueError: if fewer than ``n`` candidates are available.
    """
    if n > len(candidates):
        raise ValueError(
            f"asked for {n} {what} items but only {len(candidates)} candidates qualify"
        )
    ordered = sorted(candidates, key=lambda p: p.id)
    return random.Random(seed).sample(ordered, n)


def _drawn(
    items: list[EvalItem], n: int | None, seed: int, what: str, draw: Callable[..., list[EvalItem]]
) -> list[EvalItem]:
    """All ``items`` when ``n`` is None, else ``draw(items, n, seed, what)``
    (:func:`_sample` or :func:`_stratified_sample`) after checking ``n >= 0``."""
    if n is None:
        return items
    _check_n(n)
    return draw(items, n, seed, what)


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


# --------------------------------------------------------------------------- wiki-qa

WIKI_QA_KINDS: tuple[str, ...] = ("born", "died", "nationality", "profession", "location", "definition")
"""Question kinds of :func:`wiki_qa_items`, each documented in :func:`wiki_questions`."""

_DESCRIPTION_LIFESPAN_RE = re.compile(
    r"\((?:c\.\s*)?(?P<born>\d{3,4})\s*[–-]\s*(?:c\.\s*)?(?P<died>\d{3,4})\)\s*$"
)
# "was an English writer", "is a French-American mathematician": the text's own nationality.
# (not "was the Sultan of Hindustan": a title, not a nationality)
_NATIONALITY_RE = re.compile(r"\b(?P<verb>was|is) an? (?P<nat>[A-Z][a-z]+(?:-[A-Z][a-z]+)*) (?!of\b)[a-z]")
# Capitalised words in that slot that name a faith, not a nationality.
_FAITHS = frozenset({"Buddhist", "Catholic", "Christian", "Hindu", "Jewish", "Muslim", "Protestant", "Shia", "Sunni"})
_TERM_SPLIT_RE = re.compile(r",\s*(?:and\s+)?|\s+and\s+")
# "City in Tombouctou Region, Mali", "Capital of Hubei, China", "Country in West Asia":
# the place is the description's last comma-separated part.
_PLACE_RE = re.compile(
    r"^(?:Capital|City|Town|Village|Municipality|Metropolis|Port|Commune|Country|State|Island|"
    r"Region|Province|Peninsula|Lake|River|Sea|Mountain range|Desert)\b[^,()]*?\b(?:in|of) "
    r"(?:[^,()]+,\s*)*(?P<place>[A-Z][^,()]*?)\s*$"
)
_MAX_ANSWER_WORDS = 4


def _verbatim(text: str, phrase: str) -> str | None:
    """``phrase`` as spelled in ``text`` (case-insensitive, whole words), or None when absent."""
    if not phrase.strip():
        return None
    match = re.search(rf"(?<!\w){re.escape(phrase.strip())}(?!\w)", text, re.IGNORECASE)
    return match.group(0) if match else None


def _subject(passage: Passage) -> str:
    """How a question names a summary's subject: its title, lower-cased when the text
    writes it so ("worship"), after the article the text opens with ("the Sahel",
    "a hat")."""
    title = passage.title or passage.id
    lowered = title[0].lower() + title[1:]
    if lowered != title and re.search(rf"(?<!\w){re.escape(lowered)}(?!\w)", passage.text):
        article = re.search(rf"\b(the|a|an) {re.escape(lowered)}(?!\w)", passage.text, re.IGNORECASE)
        return f"{article.group(1).lower()} {lowered}" if article else lowered
    match = re.match(rf"(The|A|An) {re.escape(title)}(?!\w)", passage.text, re.IGNORECASE)
    return f"{match.group(1).lower()} {title}" if match else title


def _possessive(name: str) -> str:
    """``"Max Weber's"``, ``"Charles Dickens'"``."""
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _person_questions(passage: Passage, description: str) -> list[tuple[str, str, list[str]]]:
    """Questions about a person: birth/death year (when the description's
    lifespan year is stated in the text as a lifespan or next to born/died),
    nationality (the text's "was a(n) <Nationality> ..." agreeing with the
    description's first word) and profession (the description's terms after
    the nationality that occur in the text)."""
    name, text = passage.title or passage.id, passage.text
    questions: list[tuple[str, str, list[str]]] = []
    lifespan = _DESCRIPTION_LIFESPAN_RE.search(description)
    if lifespan:
        born, died = lifespan.group("born"), lifespan.group("died")
        if re.search(rf"\(\s*(?:born\s+)?{born}\s*[–-]|\bborn\b[^.]{{0,40}}\b{born}\b", text):
            questions.append(("born", f"In what year was {name} born?", [born]))
        if re.search(rf"[–-]\s*{died}\s*\)|\bdied\b[^.]{{0,40}}\b{died}\b", text):
            questions.append(("died", f"In what year did {name} die?", [died]))
    nationality = _NATIONALITY_RE.search(text)
    described = description.split(" ", 1)
    parts = set(nationality.group("nat").split("-")) if nationality else set()
    if parts & set(described[0].split("-")) and not parts & _FAITHS:
        verb, phrase = nationality.group("verb"), nationality.group("nat")
        answers = list(dict.fromkeys([phrase, *phrase.split("-")]))
        questions.append(("nationality", f"What nationality {verb} {name}?", answers))
        if len(described) > 1:
            terms = _TERM_SPLIT_RE.split(_DESCRIPTION_LIFESPAN_RE.sub("", described[1]).strip())
            found = [_verbatim(text, t) for t in terms if 0 < len(t.split()) <= _MAX_ANSWER_WORDS]
            found = [t for t in found if t]
            if found:
                questions.append(("profession", f"What {verb} {_possessive(name)} profession?", found))
    return questions


def _topic_questions(passage: Passage, description: str) -> list[tuple[str, str, list[str]]]:
    """Questions about anything else: where a place lies (the description's last
    part: "City in Tombouctou Region, Mali" -> "Mali", "Country in West Asia" ->
    "West Asia") and what it is (the description, when the text says it
    verbatim in at most four words)."""
    subject, text = _subject(passage), passage.text
    questions: list[tuple[str, str, list[str]]] = []
    place = _PLACE_RE.match(description)
    if place and (where := _verbatim(text, place.group("place"))):
        questions.append(("location", f"Where is {subject}?", [where]))
    if len(description.split()) <= _MAX_ANSWER_WORDS and (what := _verbatim(text, description)):
        questions.append(("definition", f"What is {subject}?", [what]))
    return questions


def wiki_questions(passage: Passage) -> list[tuple[str, str, list[str]]]:
    """Every question the summary ``passage`` answers, as ``(kind, question, answers)``.

    People (``metadata["topic"] == "People"``) get the kinds born, died,
    nationality and profession; other articles location and definition (see
    the two helpers' rules). ``metadata["description"]`` (the Wikipedia short
    description) drives every kind. Every answer is a short string (at most
    four words, or a year) that occurs verbatim in ``passage.text`` and not in
    the question ("Where is Kingston, Jamaica?" is dropped).
    """
    description = str(passage.metadata.get("description") or "").strip()
    if str(passage.metadata.get("topic") or "").casefold() == BIO_TOPIC.casefold():
        candidates = _person_questions(passage, description)
    else:
        candidates = _topic_questions(passage, description)
    questions = []
    for kind, question, answers in candidates:
        kept = [a for a in answers if not _verbatim(question, a)]
        if kept:
            questions.append((kind, question, kept))
    return questions


def wiki_qa_items(n: int, seed: int = 0, passages: list[Passage] | None = None) -> list[EvalItem]:
    """Questions built from the Wikipedia lead summaries themselves.

    Each summary with at least one question (:func:`wiki_questions`) is a
    candidate; ``n`` candidates are drawn as in :func:`bio_items` and each gets
    one of its questions, chosen with ``Random(f"{seed}:{passage id}")`` (the
    same seed gives the same question). The question is the prompt and the
    retrieval query.

    Args:
        n: number of items (``0`` gives ``[]``).
        seed: sampling seed.
        passages: candidate pool; defaults to ``load_wikipedia_summaries()``
            (the runner passes the index's corpus: with the default index over
            the people, every question is about a person).

    Returns:
        Items ``"wiki-qa/{passage id}"`` with reference ``""`` and meta
        ``{"answers", "passage_id" (the gold summary), "kind", "chat": True}``.

    Raises:
        ValueError: if ``n < 0`` or fewer than ``n`` summaries yield a question.
    """
    _check_n(n)
    pool = load_wikipedia_summaries() if passages is None else passages
    questions = {p.id: q for p in pool if (q := wiki_questions(p))}
    candidates = [p for p in pool if p.id in questions]
    logger.debug("wiki_qa_items: %d of %d passages yield a question", len(candidates), len(pool))
    items = []
    for passage in _sample(candidates, n, seed, "wiki-qa"):
        kind, question, answers = random.Random(f"{seed}:{passage.id}").choice(questions[passage.id])
        items.append(
            EvalItem(
                id=f"wiki-qa/{passage.id}",
                prompt=question,
                query=question,
                reference="",
                meta={"answers": answers, "passage_id": passage.id, "kind": kind, "chat": True},
            )
        )
    return items


def _parse_qa_record(record: dict[str, Any], where: str) -> tuple[str | None, str, list[str], str | None]:
    """One QA record as ``(id or None, question, answers, gold passage id or None)``.

    The gold passage id is the record's ``passage_id``, else its ``doc_id``.

    Raises:
        ValueError: naming ``where`` (path:line) for a missing/empty ``question``
            string, ``answers`` that is not a non-empty list of non-empty strings,
            or a gold id that is not a non-empty string.
    """
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
    gold = record.get("passage_id", record.get("doc_id"))
    if gold is not None and (not isinstance(gold, str) or not gold):
        raise ValueError(f"{where}: 'passage_id'/'doc_id' must be a non-empty string")
    raw_id = record.get("id")
    return (None if raw_id is None else str(raw_id)), question.strip(), answers, gold


def qa_items(path: str | Path) -> list[EvalItem]:
    """Question-answering items from a JSONL file.

    Each non-blank line is ``{"question": str, "answers": [str, ...], "id"?: any,
    "passage_id"? or "doc_id"?: str}``. The prompt and query are the question,
    the reference is ``""`` and meta is ``{"answers": [...], "chat": True}``,
    plus ``"passage_id"`` (the gold passage or document id) when the record
    names one, which lets the runner's absent condition remove it. Missing ids
    become ``"qa/{line}"`` (1-based line number).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: on a malformed line (message gives ``path:line``), a
            duplicate id, or a file without records.
    """
    path = Path(path)
    items: list[EvalItem] = []
    seen: set[str] = set()
    for line_number, record in iter_jsonl(path):  # lines end at \n only
        where = f"{path}:{line_number}"
        raw_id, question, answers, gold = _parse_qa_record(record, where)
        item_id = raw_id if raw_id is not None else f"qa/{line_number}"
        if item_id in seen:
            raise ValueError(f"{where}: duplicate id {item_id!r}")
        seen.add(item_id)
        meta: dict[str, Any] = {"answers": answers, "chat": True}
        if gold is not None:
            meta["passage_id"] = gold
        items.append(EvalItem(id=item_id, prompt=question, query=question, reference="", meta=meta))
    if not items:
        raise ValueError(f"{path}: no QA records found")
    return items


# --------------------------------------------------------------------------- docs


DOCS_QA_PATH = Path(__file__).with_name("data") / "docs_qa.jsonl"
"""The docs task's hand-written questions: ``{"id", "question", "answers", "doc_id"}``
a line, ``doc_id`` a module of :data:`~.docs_corpus.DOCS_MODULES`; every answer is a
word or identifier of that module's document (tested)."""


def docs_items(n: int | None = None, seed: int = 0) -> list[EvalItem]:
    """Natural questions about the standard-library documentation corpus.

    The questions (:data:`DOCS_QA_PATH`) are answered by the docstrings of
    :func:`~nest_benchmarks.docs_corpus.docs_corpus`; the gold
    answers are short strings a good answer must contain (a function,
    parameter or constant name, a default value).

    Args:
        n: number of items; None gives all of them in file order.
        seed: with ``n``, the items are ``Random(seed).sample`` of the questions
            sorted by id (deterministic).

    Returns:
        Items with meta ``{"answers", "passage_id": module name, "chat": True}``.

    Raises:
        ValueError: if ``n < 0`` or larger than the number of questions.
    """
    return _drawn(qa_items(DOCS_QA_PATH), n, seed, "docs", _sample)


# --------------------------------------------------------------------------- markdown-docs

MARKDOWN_QA_KINDS: tuple[str, ...] = ("howto", "followup", "unanswerable")
"""Kinds of :func:`markdown_qa_items` records: a question answered somewhere in a
section; a follow-up whose ``messages`` hold the earlier turns it needs; a question
the documents do not answer (``answers`` empty, ``doc`` null)."""

_ROLES = frozenset({"system", "user", "assistant"})


def _string(record: Mapping[str, Any], key: str, where: str) -> str:
    """``record[key]`` as a stripped non-empty string (else ValueError naming ``where`` and ``key``)."""
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string")
    return value.strip()


def _history(record: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    """The ``messages`` of a follow-up record: a non-empty list of ``{"role", "content"}``
    turns (roles system/user/assistant) that ends with the assistant's answer."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: a followup needs 'messages', a non-empty list of earlier turns")
    history = []
    for turn in messages:
        if not isinstance(turn, Mapping) or turn.get("role") not in _ROLES:
            raise ValueError(f"{where}: every message needs a 'role' among {sorted(_ROLES)}")
        history.append({"role": turn["role"], "content": _string(turn, "content", where)})
    if history[-1]["role"] != "assistant":
        raise ValueError(f"{where}: 'messages' must end with the assistant's turn the follow-up answers to")
    return history


def _gold(
    record: Mapping[str, Any], where: str, unanswerable: bool, source_key: str
) -> tuple[list[str], str | None]:
    """``(answers, source)`` of a question record: ``answers`` a list of non-empty strings,
    empty exactly when the question is ``unanswerable``, and ``record[source_key]`` (the
    gold document or passage) a non-empty string, or null for an unanswerable question.

    Raises:
        ValueError: naming ``where`` and the field that breaks these rules.
    """
    answers, source = record.get("answers"), record.get(source_key)
    if not isinstance(answers, list) or not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError(f"{where}: 'answers' must be a list of non-empty strings")
    if unanswerable and (answers or source is not None):
        raise ValueError(f"{where}: an unanswerable question has 'answers': [] and {source_key!r}: null")
    if not unanswerable and (not answers or not isinstance(source, str) or not source):
        raise ValueError(f"{where}: an answerable question needs gold 'answers' and its {source_key!r}")
    return answers, source


def _jsonl_items(path: str | Path, build: Callable[[dict[str, Any], str], EvalItem]) -> list[EvalItem]:
    """``build(record, "path:line")`` for every record of the JSONL file ``path``
    (:func:`~nest_integrations.core.jsonl.iter_jsonl`), in file order.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: invalid JSON or a non-object line, what ``build`` refuses, or
            a duplicate item id (``path:line`` named).
    """
    items: list[EvalItem] = []
    seen: set[str] = set()
    for line_number, record in iter_jsonl(path):
        where = f"{path}:{line_number}"
        item = build(record, where)
        if item.id in seen:
            raise ValueError(f"{where}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    return items


def _markdown_qa_item(record: dict[str, Any], where: str) -> EvalItem:
    """One :data:`MARKDOWN_QA_KINDS` record as an item (see :func:`markdown_qa_items`).

    Raises:
        ValueError: naming ``where`` and the field: a missing id or question, an
            unknown kind, answers that are not strings (or not empty exactly when
            the kind is unanswerable), a ``doc`` that is not a file name for an
            answerable question (or set for an unanswerable one), ``unanswerable``
            disagreeing with the kind, follow-up ``messages`` missing or malformed,
            or ``messages`` on a kind other than a follow-up or an unanswerable question.
    """
    item_id, question = _string(record, "id", where), _string(record, "question", where)
    kind = record.get("kind")
    if kind not in MARKDOWN_QA_KINDS:
        raise ValueError(f"{where}: 'kind' must be one of {MARKDOWN_QA_KINDS}, got {kind!r}")
    unanswerable = kind == "unanswerable"
    if bool(record.get("unanswerable", False)) != unanswerable:
        raise ValueError(f"{where}: 'unanswerable' must be true exactly for kind 'unanswerable'")
    answers, doc = _gold(record, where, unanswerable, "doc")
    if kind == "followup" and "messages" not in record:
        raise ValueError(f"{where}: 'messages' is required for a followup")
    if kind not in ("followup", "unanswerable") and "messages" in record:
        raise ValueError(f"{where}: 'messages' is only for a followup or an unanswerable question asked after one")
    prompt: str | list[dict[str, str]] = question
    if "messages" in record:
        prompt = [*_history(record, where), {"role": "user", "content": question}]
    meta: dict[str, Any] = {"answers": answers, "kind": kind, "unanswerable": unanswerable, "chat": True}
    if doc is not None:
        meta["passage_id"] = doc
    query = retrieval_query(prompt) if isinstance(prompt, list) else question
    return EvalItem(id=item_id, prompt=prompt, query=query, reference="", meta=meta)


def markdown_qa_items(path: str | Path) -> list[EvalItem]:
    """The items of a JSONL file of Markdown-documentation questions.

    Each non-blank line is ``{"id", "question", "answers": [str, ...], "doc":
    file name or null, "kind": one of MARKDOWN_QA_KINDS, "messages"?: [...],
    "unanswerable"?: bool}``; ``messages``, the conversation before the question, is
    required for a follow-up and allowed for an unanswerable question asked after one. The
    prompt is the question, or with ``messages`` ``messages + [the question as the user's
    turn]``; the query is the question, or with ``messages``
    :func:`~nest_integrations.policy.conversation.retrieval_query` of that conversation (as
    the decoder and the integrations build it). Meta:
    ``{"answers", "kind", "unanswerable", "chat": True}`` plus ``"passage_id"``
    = ``doc`` when the question has one.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: on invalid JSON or a malformed record (``path:line`` and the
            field named), a duplicate id, or a file without records.
    """
    items = _jsonl_items(path, _markdown_qa_item)
    if not items:
        raise ValueError(f"{path}: no records found")
    return items


def _stratified_sample(items: Sequence[EvalItem], n: int, seed: int, what: str) -> list[EvalItem]:
    """``n`` items drawn per ``meta["kind"]`` in proportion to the kinds' shares, each
    kind by :func:`_sample`; returned in the input order.

    Every kind gets at least one item when ``n`` allows (taken from the largest
    kinds), and the largest remainders get the rounding, so a small ``n`` still
    holds follow-ups and unanswerable questions.

    Raises:
        ValueError: if ``n`` exceeds ``len(items)``.
    """
    if n > len(items):
        raise ValueError(f"asked for {n} {what} items but only {len(items)} candidates qualify")
    kinds = sorted({item.meta["kind"] for item in items})
    pools = {kind: [item for item in items if item.meta["kind"] == kind] for kind in kinds}
    exact = {kind: n * len(pools[kind]) / len(items) for kind in kinds}
    floor = 1 if n >= len(kinds) else 0
    counts = {kind: max(floor, int(exact[kind])) for kind in kinds}
    while sum(counts.values()) > n:
        counts[max(kinds, key=lambda k: counts[k])] -= 1
    for kind in sorted(kinds, key=lambda k: counts[k] - exact[k])[: n - sum(counts.values())]:
        counts[kind] += 1
    chosen = {item.id for kind in kinds for item in _sample(pools[kind], counts[kind], seed, what)}
    return [item for item in items if item.id in chosen]


def markdown_docs_items(n: int | None = None, seed: int = 0) -> list[EvalItem]:
    """Questions about the Fastify Markdown reference docs (:mod:`.markdown_docs`).

    Args:
        n: number of items; None gives all of them in file order.
        seed: with ``n``, the draw is stratified by kind (:func:`_stratified_sample`)
            and deterministic.

    Returns:
        Items of :func:`markdown_qa_items` over
        :data:`~.markdown_docs.FASTIFY_QA_PATH`.

    Raises:
        ValueError: if ``n < 0`` or larger than the number of questions.
    """
    from .markdown_docs import FASTIFY_QA_PATH

    return _drawn(markdown_qa_items(FASTIFY_QA_PATH), n, seed, "markdown-docs", _stratified_sample)


def markdown_docs_pino_items(n: int | None = None, seed: int = 0) -> list[EvalItem]:
    """Questions about the Pino logger's Markdown API docs (:mod:`.markdown_docs`), the
    second Markdown domain; drawn as :func:`markdown_docs_items` draws.

    Returns:
        Items of :func:`markdown_qa_items` over :data:`~.markdown_docs.PINO_QA_PATH`.

    Raises:
        ValueError: if ``n < 0`` or larger than the number of questions.
    """
    from .markdown_docs import PINO_QA_PATH

    return _drawn(markdown_qa_items(PINO_QA_PATH), n, seed, "markdown-docs-pino", _stratified_sample)


# --------------------------------------------------------------------------- wiki-qa-hard

WIKI_QA_HARD_PATH = Path(__file__).with_name("data") / "wiki_qa_hard.jsonl"
"""The wiki-qa-hard questions: ``{"id", "question", "answers", "passage_id", "name",
"unanswerable"}`` a line. An answerable question names a person of the People topic
(``name``, the summary's title, occurs in the question) and its answers occur in that
summary (``passage_id``) but not in its first sentence; an unanswerable one names a
person no summary mentions, with ``"answers": []`` and ``"passage_id": null`` (tested)."""


def _wiki_qa_hard_item(record: Mapping[str, Any], where: str) -> EvalItem:
    """One :data:`WIKI_QA_HARD_PATH` record as an item (see :func:`wiki_qa_hard_items`).

    Raises:
        ValueError: naming ``where`` and the field: a missing id, question or name,
            ``unanswerable`` that is not a bool, answers that are not a list of
            non-empty strings (or not empty exactly when unanswerable), or a
            ``passage_id`` that is not a non-empty string for an answerable
            question (or set for an unanswerable one).
    """
    item_id, question = _string(record, "id", where), _string(record, "question", where)
    name = _string(record, "name", where)
    unanswerable = record.get("unanswerable", False)
    if not isinstance(unanswerable, bool):
        raise ValueError(f"{where}: 'unanswerable' must be true or false")
    answers, gold = _gold(record, where, unanswerable, "passage_id")
    meta: dict[str, Any] = {
        "answers": answers,
        "name": name,
        "kind": "unanswerable" if unanswerable else "fact",
        "unanswerable": unanswerable,
        "chat": True,
    }
    if gold is not None:
        meta["passage_id"] = gold
    return EvalItem(id=item_id, prompt=question, query=question, reference="", meta=meta)


def wiki_qa_hard_items(n: int | None = None, seed: int = 0) -> list[EvalItem]:
    """Factual questions about people whose answers lie past the summary's first sentence.

    :func:`wiki_qa_items` asks about a summary's short description, which its
    first sentence restates; these hand-written questions (:data:`WIKI_QA_HARD_PATH`)
    ask for a place, year, name or work the summary gives later ("Where was
    Charles Darwin buried?"), so a mode must find the answer inside the passage
    rather than copy its opening. The unanswerable questions name people the
    corpus does not hold: a good answer cites nothing.

    Args:
        n: number of items; None gives all of them in file order.
        seed: with ``n``, the draw is stratified by ``meta["kind"]`` ("fact" or
            "unanswerable", :func:`_stratified_sample`) and deterministic.

    Returns:
        Items with meta ``{"answers", "name", "kind", "unanswerable", "chat": True}``
        plus ``"passage_id"`` (the summary's id in the People index) for the
        answerable ones.

    Raises:
        ValueError: if ``n < 0`` or larger than the number of questions, or on a
            malformed record or duplicate id (``path:line`` named).
    """
    return _drawn(_jsonl_items(WIKI_QA_HARD_PATH, _wiki_qa_hard_item), n, seed, "wiki-qa-hard", _stratified_sample)


TASKS: dict[str, Callable[..., list[EvalItem]]] = {
    "bio": bio_items,
    "completion": completion_items,
    "qa": qa_items,
    "wiki-qa": wiki_qa_items,
    "docs": docs_items,
    "markdown-docs": markdown_docs_items,
    "markdown-docs-pino": markdown_docs_pino_items,
    "wiki-qa-hard": wiki_qa_hard_items,
    "markdown-qa": markdown_qa_items,
}

FILE_TASKS: frozenset[str] = frozenset({"qa", "markdown-qa"})
"""Tasks whose questions come from a JSONL file of the user's (``qa_path``), over an index of
their documents: ``qa`` in the plain format (:func:`qa_items`), ``markdown-qa`` in the
documentation format with kinds, follow-ups and unanswerable questions (:func:`markdown_qa_items`)."""

QA_TASKS: frozenset[str] = frozenset(
    {"qa", "wiki-qa", "docs", "markdown-docs", "markdown-docs-pino", "wiki-qa-hard", "markdown-qa"}
)
"""Tasks whose items carry gold ``answers`` (scored by answer recall; markdown-docs(-pino) and
wiki-qa-hard items marked ``meta["unanswerable"]`` have none and are scored apart)."""

TASK_MAX_NEW_TOKENS: dict[str, int] = {
    "bio": 128, "completion": 128, "qa": 64, "wiki-qa": 64, "docs": 64, "markdown-docs": 64,
    "markdown-docs-pino": 64, "wiki-qa-hard": 64, "markdown-qa": NestConfig.model_fields["max_new_tokens"].default,
}
"""Default generation budget per task: the bundled question sets get short answers; a documentation folder's
questions (markdown-qa) get what ``nest generate`` gives by default."""


def get_task(name: str) -> Callable[..., list[EvalItem]]:
    """The item builder registered under ``name`` in :data:`TASKS`.

    Raises:
        ValueError: for an unknown name, listing the available task names.
    """
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(sorted(TASKS))}") from None
