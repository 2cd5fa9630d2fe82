"""Evaluation metrics for NEST generations.

All functions are pure and work offline. They fall into these groups:

* text overlap: :func:`rouge_scores`, :func:`years`, :func:`year_precision`;
* question answering: :func:`normalize_answer`, :func:`answer_recall`;
* biography entity checks: :func:`opens_with_entity`,
  :func:`opens_with_other_name`, :func:`fragment_answer`;
* seams (where a copy starts): :func:`seam_ok`, :func:`seam_ok_rate`;
* degenerate output and copied markup: :func:`repeated_ngram`, :func:`repeated_ngrams`,
  :func:`recopied_source`, :func:`is_repetitive`, :func:`garbled_model_text`, :func:`markup_ranges`,
  :func:`copied_markup`; questions the corpus does not answer:
  :func:`unanswerable_scores`;
* output-contract checks and speed: :func:`span_integrity`,
  :func:`spans_tile_text`, :func:`tokens_per_forward`, plus :func:`aggregate`
  to average per-item rows.
"""

from __future__ import annotations

import functools
import math
import re
import string
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from rouge_score import rouge_scorer

from nest_integrations.decoding.output import chunk_offsets, tokens_per_decoding_forward

__all__ = [
    "MARKUP_KINDS",
    "aggregate",
    "answer_recall",
    "copied_markup",
    "fragment_answer",
    "garbled_model_text",
    "is_repetitive",
    "markup_ranges",
    "model_text_in_code",
    "normalize_answer",
    "opens_with_entity",
    "opens_with_other_name",
    "recopied_source",
    "repeated_ngram",
    "repeated_ngrams",
    "rouge_scores",
    "seam_ok",
    "seam_ok_rate",
    "span_integrity",
    "spans_tile_text",
    "tokens_per_forward",
    "unanswerable_scores",
    "year_precision",
    "years",
]

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rougeL")

_YEAR_RE = re.compile(r"\b(?:1\d{3}|20\d{2})\b")
_ARTICLES_RE = re.compile(r"\b(?:a|an|the)\b")
_BRACKETED_RE = re.compile(r"\([^()]*\)|\[[^\[\]]*\]")
_POSSESSIVE_RE = re.compile(r"['\u2019]s\b", re.IGNORECASE)

# Name suffixes that are never used as a "last name" on their own.
_NAME_SUFFIXES = frozenset(
    {"jr", "sr", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi", "xii"}
)
# Lower-case particles allowed *inside* a capitalised name ("Leonardo da Vinci",
# "Catherine of Aragon", "Gwanggaeto the Great", "Muslim ibn al-Hajjaj").
_NAME_PARTICLES = frozenset(
    {"al", "bin", "da", "de", "del", "della", "der", "di", "du", "el", "ibn",
     "la", "le", "of", "the", "van", "von", "y"}
)
# Capitalised function words that start sentences but never start a name.
_LEADING_FUNCTION_WORDS = frozenset(
    {"a", "after", "an", "as", "at", "before", "born", "by", "certainly", "during",
     "for", "from", "he", "her", "here", "his", "i", "in", "it", "its", "on", "she",
     "sure", "that", "the", "their", "there", "these", "they", "this", "we", "you"}
)
# Lower-case words that end the "opening" of a biography: the subject comes before them.
_VERB_LIKE = frozenset(
    {"are", "became", "becomes", "been", "being", "born", "did", "does", "had", "has",
     "have", "is", "remained", "remains", "served", "serves", "was", "were", "won",
     "worked", "works", "wrote", "writes"}
)
# Tokens ending with these characters end a run of capitalised words.
_RUN_BREAKING_END = frozenset(",;:!?\"\u201d")
_ABBREVIATIONS = frozenset({"dr", "jr", "mr", "mrs", "ms", "prof", "sr", "st"})
_MARKDOWN_MARKS = "*_"
_OPENING_MARKS = "\"'\u201c\u2018(#" + _MARKDOWN_MARKS


# --------------------------------------------------------------------------- overlap


@functools.lru_cache(maxsize=1)
def _rouge_scorer() -> rouge_scorer.RougeScorer:
    """Return a cached ROUGE scorer (rouge1 and rougeL, Porter stemmer)."""
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1 and ROUGE-L F1 of ``prediction`` against ``reference``.

    Args:
        prediction: generated text.
        reference: gold text.

    Returns:
        ``{"rouge1": f1, "rougeL": f1}`` with values in ``[0, 1]``, computed by the
        ``rouge_score`` package with its Porter stemmer and standard tokenizer
        (lower-cased ASCII alphanumerics). When either string is empty or
        whitespace-only both scores are ``0.0``.
    """
    if not prediction.strip() or not reference.strip():
        return {key: 0.0 for key in ROUGE_TYPES}
    scores = _rouge_scorer().score(reference, prediction)
    return {key: float(scores[key].fmeasure) for key in ROUGE_TYPES}


def years(text: str) -> list[str]:
    """Four-digit years (1000-2099) mentioned in ``text``, in order of appearance.

    Years must be whole words: ``"1867"`` and ``"1867-1934"`` match, while
    ``"1860s"``, ``"12345"`` or ``"AD1500"`` do not. Duplicates are kept.
    """
    return _YEAR_RE.findall(text)


def year_precision(prediction: str, gold: str) -> float | None:
    """Share of the distinct years in ``prediction`` that also occur in ``gold``.

    Distinct years are used so that repeating one year does not inflate the score.

    Returns:
        A value in ``[0, 1]``, or ``None`` when the prediction mentions no year
        (precision is undefined; :func:`aggregate` skips ``None``).
    """
    predicted = set(years(prediction))
    if not predicted:
        return None
    gold_years = set(years(gold))
    return len(predicted & gold_years) / len(predicted)


# --------------------------------------------------------------------------- QA


def _fold(text: str) -> str:
    """NFKC-normalise ``text`` and lower-case it."""
    return unicodedata.normalize("NFKC", text).lower()


def normalize_answer(s: str, *, split_punctuation: bool = False) -> str:
    """SQuAD-style answer normalisation.

    Steps: Unicode NFKC, lower-case, dashes (Unicode category ``Pd``) become
    spaces so ``"1867–1934"`` keeps both years as tokens, all other punctuation
    (ASCII and Unicode category ``P*``) is removed -- or, with
    ``split_punctuation``, becomes a space too, so code keeps its identifiers
    apart (``"sort_keys=True"`` -> ``"sort keys true"``) -- the articles
    a/an/the are dropped and whitespace is collapsed.

    Examples: ``"The  Eiffel-Tower!"`` -> ``"eiffel tower"``;
    ``"ＡＢＣ"`` (full width) -> ``"abc"``.
    """
    text = _fold(s)
    chars = []
    for char in text:
        category = unicodedata.category(char)
        if category == "Pd":
            chars.append(" ")
        elif category.startswith("P") or char in string.punctuation:
            chars.append(" " if split_punctuation else "")
        else:
            chars.append(char)
    text = _ARTICLES_RE.sub(" ", "".join(chars))
    return " ".join(text.split())


def answer_recall(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if any gold answer occurs in the prediction, else 0.0.

    Both sides are normalised with :func:`normalize_answer`; an answer must match
    whole tokens (``"paris"`` matches ``"in paris france"`` but ``"art"`` does not
    match ``"party"``). An answer also counts when it matches with punctuation
    read as a separator on both sides, so identifiers are found inside code:
    ``"sort_keys"`` in ``"json.dumps(d, sort_keys=True)"``, ``"loads"`` in
    ``"json.loads(s)"``.

    Raises:
        ValueError: if ``answers`` is empty or every answer normalises to ``""``.
    """
    if not answers:
        raise ValueError("answer_recall needs at least one gold answer")
    for split in (False, True):
        normalised = [normalize_answer(a, split_punctuation=split) for a in answers]
        normalised = [a for a in normalised if a]
        if not normalised:
            raise ValueError(f"all gold answers normalise to empty strings: {list(answers)!r}")
        haystack = f" {normalize_answer(prediction, split_punctuation=split)} "
        if any(f" {a} " in haystack for a in normalised):
            return 1.0
    return 0.0


# --------------------------------------------------------------------------- entities


def _strip_brackets(text: str) -> str:
    """Remove (possibly nested) ``(...)`` and ``[...]`` groups from ``text``."""
    previous = None
    while previous != text:
        previous, text = text, _BRACKETED_RE.sub(" ", text)
    return text


def _name_tokens(text: str) -> list[str]:
    """Comparable tokens of a name or text fragment.

    NFKC + lower-case, diacritics removed (``"Brâncuși"`` -> ``"brancusi"``),
    possessive ``'s`` dropped, dashes split words (``"Augustin-Jean"`` ->
    ``augustin``, ``jean``), other punctuation removed.
    """
    text = _POSSESSIVE_RE.sub("", _fold(text))
    decomposed = unicodedata.normalize("NFKD", text)
    chars = []
    for char in decomposed:
        category = unicodedata.category(char)
        if category == "Mn":
            continue
        chars.append(" " if category == "Pd" or char.isspace() else char)
    kept = "".join(c for c in chars if c.isalnum() or c == " ")
    return kept.split()


def _contains_run(tokens: Sequence[str], run: Sequence[str]) -> bool:
    """True if ``run`` occurs as a contiguous sub-sequence of ``tokens``."""
    width = len(run)
    return width > 0 and any(
        list(tokens[i : i + width]) == list(run) for i in range(len(tokens) - width + 1)
    )


def _is_subsequence(small: Sequence[str], big: Sequence[str]) -> bool:
    """True if ``small`` is a (not necessarily contiguous) sub-sequence of ``big``."""
    remaining = iter(big)
    return all(token in remaining for token in small)


def _target_tokens(name: str) -> list[str]:
    """Tokens of the target ``name`` with bracketed qualifiers removed.

    Raises:
        ValueError: if nothing remains (e.g. ``name`` is empty).
    """
    tokens = _name_tokens(_strip_brackets(name))
    if not tokens:
        raise ValueError(f"name has no usable tokens: {name!r}")
    return tokens


def _last_name(tokens: Sequence[str]) -> str:
    """Last token of a multi-token name, skipping suffixes such as Jr. or III."""
    for token in reversed(tokens):
        if token not in _NAME_SUFFIXES:
            return token
    return tokens[-1]


def _check_window(window: int) -> None:
    """Raise ValueError unless ``window`` is a positive int."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")


def opens_with_entity(prediction: str, name: str, window: int = 12) -> bool:
    """Whether the first ``window`` words of ``prediction`` mention the person ``name``.

    Heuristic: bracketed text such as ``"(born 1950)"`` is removed from both the
    prediction and the name (``"Hans Krebs (biochemist)"`` -> ``"Hans Krebs"``)
    before taking the window; comparison is case-, accent- and
    punctuation-insensitive. The window mentions the person if it contains

    * the full name as consecutive tokens, or
    * for multi-token names, the last name token (suffixes like "Jr."/"II" are
      skipped, so "Johann Strauss II" -> "strauss"), or
    * for single-token names ("Baybars"), that token.

    Note that a relative sharing the last name ("Pierre Curie" for "Marie
    Curie") therefore counts as a mention; use :func:`opens_with_other_name`
    to detect that case.

    Raises:
        ValueError: if ``window < 1`` or ``name`` has no usable tokens.
    """
    _check_window(window)
    target = _target_tokens(name)
    words = _strip_brackets(prediction).split()[:window]
    tokens = _name_tokens(" ".join(words))
    if _contains_run(tokens, target):
        return True
    return len(target) > 1 and _last_name(target) in tokens


def _opening_words(prediction: str, window: int) -> list[str]:
    """Raw words of the prediction's opening: the first ``window`` words
    (brackets removed), cut before the first verb-like lower-case word."""
    words = _strip_brackets(prediction).split()[:window]
    for index, word in enumerate(words):
        if word.strip(string.punctuation) in _VERB_LIKE:
            return words[:index]
    return words


def _is_capitalised(word: str) -> bool:
    """True if the word's first letter is upper-case (leading quotes/Markdown ignored)."""
    core = word.lstrip(_OPENING_MARKS)
    return bool(core) and core[0].isupper()


def _ends_run(word: str) -> bool:
    """True if a run of capitalised words must stop after ``word``.

    Commas, colons, semicolons, ``!``/``?`` and closing quotes always end a run;
    a full stop ends it unless ``word`` is an initial ("T.") or a known
    abbreviation ("St.", "Jr."). Trailing Markdown emphasis (``**``) is ignored.
    """
    word = word.rstrip(_MARKDOWN_MARKS)
    if not word:
        return False
    if word[-1] in _RUN_BREAKING_END:
        return True
    if word.endswith("."):
        core = word.rstrip(".").lstrip(_OPENING_MARKS)
        is_initial = len(core) == 1 and core.isalpha()
        return not (is_initial or core.lower() in _ABBREVIATIONS)
    return False


def _capitalised_runs(words: Sequence[str]) -> list[list[str]]:
    """Maximal runs of capitalised words, allowing inner name particles.

    Leading function words ("The", "In", "Sure") and trailing particles are
    trimmed from each run; only runs with 2+ capitalised words are returned,
    so a lone capitalised word at a sentence start is never a name.
    """
    runs: list[list[str]] = []
    current: list[str] = []

    def close() -> None:
        run = list(current)
        while run and run[0].strip(string.punctuation).lower() in _LEADING_FUNCTION_WORDS:
            run.pop(0)
        while run and not _is_capitalised(run[-1]):
            run.pop()
        if sum(_is_capitalised(w) for w in run) >= 2:
            runs.append(run)
        current.clear()

    for word in words:
        bare = word.strip(string.punctuation).lower()
        if _is_capitalised(word) or (current and bare in _NAME_PARTICLES):
            current.append(word)
            if _ends_run(word):
                close()
        else:
            close()
    close()
    return runs


def opens_with_other_name(prediction: str, name: str, window: int = 12) -> bool:
    """Whether the prediction starts by talking about somebody other than ``name``.

    Heuristic:

    1. The *opening* is the first ``window`` words (bracketed text removed),
       cut before the first verb-like lower-case word ("is", "was", "became",
       "born", ... ) -- the grammatical subject of a biography comes first.
    2. Candidate names are runs of 2+ consecutive capitalised words in the
       opening (inner particles like "da", "of", "ibn" allowed; leading
       function words like "The", "In", "Sure" dropped; commas and sentence
       ends break runs, initials like "T." do not).
    3. A candidate *is the target* when, after case/accent/punctuation folding,
       either its tokens are a sub-sequence of the target's tokens or the
       target's tokens are a sub-sequence of its tokens ("Hans Krebs" vs
       "Hans Adolf Krebs", "Sir Isaac Newton" vs "Isaac Newton", "Marie
       Skłodowska Curie" vs "Marie Curie"). Otherwise it is another name --
       including relatives sharing a surname ("Pierre Curie" vs "Marie Curie").
    4. Returns True iff some candidate is another name and no candidate is the
       target (an opening like "Albert Einstein and Marie Curie" is not
       about somebody else).

    Known limitations: multi-word capitalised non-person phrases ("World War
    II", "New York") count as names when they open the text and the target is
    absent; single-token mentions of someone else ("Einstein was...") are not
    detected; spelling variants of the target ("Maria Skłodowska-Curie" for
    "Marie Curie") count as other names unless the target also appears.

    Raises:
        ValueError: if ``window < 1`` or ``name`` has no usable tokens.
    """
    _check_window(window)
    target = _target_tokens(name)
    runs = _capitalised_runs(_opening_words(prediction, window))
    candidates = [tokens for tokens in (_name_tokens(" ".join(run)) for run in runs) if tokens]
    is_target = [_is_subsequence(c, target) or _is_subsequence(target, c) for c in candidates]
    return bool(candidates) and not any(is_target)


# --------------------------------------------------------------------------- seams

# A copy may start after these in its source: a sentence end (. ! ?, closing
# quotes/brackets allowed after it) or a clause end (: ;), then whitespace.
_SEAM_BOUNDARY_RE = re.compile(r"[.!?:;][\"'\u201d\u2019)\]]*\s*$|\n\s*$|(?:^|\n) {0,3}#{1,6}[ \t]*$")
_SEAM_CONTEXT_WORDS = 3
_OPENERS_CLOSERS = (("(", ")"), ("[", "]"), ("\u201c", "\u201d"))


def _unclosed(text: str) -> set[str]:
    """Which of ``(``, ``[``, curly and straight double quotes are open at the end of ``text``."""
    open_marks = {o for o, c in _OPENERS_CLOSERS if text.count(o) > text.count(c)}
    if text.count('"') % 2:
        open_marks.add('"')
    return open_marks


def _last_words(text: str, k: int) -> list[str]:
    """The last ``k`` words of ``text``: NFKC, lower-cased, punctuation dropped (articles kept)."""
    return re.findall(r"\w+", _fold(text))[-k:] if k > 0 else []


def seam_ok(passage: str, char_start: int, written: str) -> bool:
    """Whether a copy of ``passage`` starting at ``char_start`` reads well after ``written``.

    A reader accepts the start when, first, it is not inside a parenthesis,
    bracket or quotation that the source opened in the current paragraph
    (since the last blank line) and ``written`` did not open too; and then when
    one of these holds:

    * ``char_start`` is 0 or only whitespace precedes it in the source;
    * the source text before it ends a sentence or a clause: ``.``, ``!``, ``?``
      (closing quotes or brackets may follow), ``:``, ``;``, a newline, or a heading's ``#``
      marks (the copy starts with the title a reader sees above the section);
    * ``written`` really ends with the source text before it: their last three
      words (fewer only when the source has fewer) agree, case and
      punctuation aside -- the copy continues what was written.

    A comma alone is not a boundary: in these sources it closes a name or an
    apposition ("Ada Lovelace, was ...", "Curie, who ...") as often as a
    clause, and a clause after a comma that fits what was written is already
    accepted by the continuation rule.

    Raises:
        ValueError: if ``char_start`` is outside ``passage``.
    """
    if not 0 <= char_start <= len(passage):
        raise ValueError(f"char_start {char_start} is outside a passage of {len(passage)} characters")
    before = passage[:char_start]
    paragraph = before[before.rfind("\n\n") + 1 :]
    if not _unclosed(paragraph) <= _unclosed(written):
        return False
    if not before.strip() or _SEAM_BOUNDARY_RE.search(before):
        return True
    context = _last_words(before, _SEAM_CONTEXT_WORDS)
    return bool(context) and _last_words(written, len(context)) == context


def seam_ok_rate(output: Mapping[str, Any], passages: Mapping[str, str]) -> float | None:
    """Share of the copied spans of ``output`` whose start a reader accepts (:func:`seam_ok`).

    Each copied span is judged by its source (``source["id"]`` in ``passages``,
    ``source["chunk_char_start"]``) against the output text before the span
    (``output["text"][:span["start"]]``). A span whose source is unknown or
    whose offsets are not ints counts as a bad seam.

    Args:
        output: a generation following the output contract.
        passages: passage id -> full passage text.

    Returns:
        A value in ``[0, 1]``, or None when nothing was copied.

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``.
    """
    text = output.get("text")
    copied = [span for span in _spans(output) if span.get("copied")]
    if not copied:
        return None
    good = 0
    for span in copied:
        source = span.get("source") if isinstance(span.get("source"), Mapping) else {}
        passage, char_start, start = passages.get(source.get("id")), chunk_offsets(source)[0], span.get("start")
        if passage is None or not isinstance(char_start, int) or not isinstance(start, int):
            continue
        good += 0 <= char_start <= len(passage) and seam_ok(passage, char_start, text[:start])
    return good / len(copied)


def _closes_unopened(text: str) -> bool:
    """Whether ``text`` closes a bracket or curly quotation before opening it."""
    for opener, closer in _OPENERS_CLOSERS:
        depth = 0
        for char in text:
            depth += (char == opener) - (char == closer)
            if depth < 0:
                return True
    return False


def fragment_answer(prediction: str, name: str) -> bool:
    """Whether a biography is a bare fragment rather than an answer about ``name``.

    True when the stripped text is empty, opens with a lower-case letter
    ("was an English ..."), opens with punctuation other than an opening quote,
    bracket or Markdown mark (", who ..."), closes a bracket or quotation it
    never opened before its first sentence ends ("1912), which gave ..."), or
    never mentions the subject (:func:`opens_with_entity` over the whole
    text: "Aryabhaṭīya and the Arya-siddhanta." for Aryabhata).

    Raises:
        ValueError: if ``name`` has no usable tokens.
    """
    text = prediction.strip()
    if not text:
        return True
    first = text[0]
    if first.islower() or (unicodedata.category(first).startswith("P") and first not in _OPENING_MARKS + "[\u00ab"):
        return True
    first_sentence = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    if _closes_unopened(first_sentence):
        return True
    return not opens_with_entity(text, name, window=len(text.split()))


# --------------------------------------------------------------------------- output contract


def _spans(output: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``spans`` list of a generation output.

    Raises:
        ValueError: if ``output`` has no ``text`` string or no ``spans`` list.
    """
    if not isinstance(output.get("text"), str):
        raise ValueError("output has no 'text' string")
    spans = output.get("spans")
    if not isinstance(spans, list):
        raise ValueError("output has no 'spans' list")
    return spans


def _copied_span_is_intact(span: Mapping[str, Any], text: str, passages: Mapping[str, str]) -> bool:
    """Whether a copied span matches both its source passage slice and the output text."""
    source = span.get("source")
    span_text = span.get("text")
    if not isinstance(source, Mapping) or not isinstance(span_text, str) or not span_text:
        return False
    passage = passages.get(source.get("id"))
    char_start, char_end = chunk_offsets(source)
    start, end = span.get("start"), span.get("end")
    if passage is None or not all(isinstance(v, int) for v in (char_start, char_end, start, end)):
        return False
    if not (0 <= char_start <= char_end <= len(passage) and 0 <= start <= end <= len(text)):
        return False
    return passage[char_start:char_end] == span_text and text[start:end] == span_text


def span_integrity(output: Mapping[str, Any], passages: Mapping[str, str]) -> float:
    """Share of copied spans that are verbatim, correctly located copies.

    A copied span (``copied`` true) is intact when its ``text`` is non-empty and
    equals both ``passages[source["id"]][chunk_char_start:chunk_char_end]`` and
    ``output["text"][start:end]``. A span whose source is missing, unknown to
    ``passages`` or has out-of-range offsets counts as not intact.

    Args:
        output: a generation result following the output contract.
        passages: passage id -> full passage text.

    Returns:
        A value in ``[0, 1]``; ``1.0`` when there are no copied spans.

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``.
    """
    text = output.get("text")
    copied = [span for span in _spans(output) if span.get("copied")]
    if not copied:
        return 1.0
    intact = sum(_copied_span_is_intact(span, text, passages) for span in copied)
    return intact / len(copied)


def spans_tile_text(output: Mapping[str, Any]) -> bool:
    """Whether the spans tile the output text exactly.

    True iff spans are in order, each starts where the previous ended (the first
    at 0), each ``text`` equals ``output["text"][start:end]``, and the last ends
    at ``len(text)``; hence their texts concatenate to ``text``. An empty text
    with no spans is tiled; a non-empty text with no spans is not.

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``.
    """
    spans = _spans(output)
    text = output["text"]
    position = 0
    for span in spans:
        start, end, span_text = span.get("start"), span.get("end"), span.get("text")
        if start != position or not isinstance(end, int) or end < start:
            return False
        if span_text != text[start:end] or len(span_text) != end - start:
            return False
        position = end
    return position == len(text)


# --------------------------------------------------------------------------- degenerate output

REPEAT_NGRAM = 4
"""Words per n-gram of :func:`repeated_ngram`."""
REPEAT_TIMES = 3
"""Occurrences of one n-gram that make an output a loop (:func:`repeated_ngram`)."""
RECOPY_MIN_CHARS = 16
"""Source characters two copied spans must share to count as a re-copy (:func:`recopied_source`)."""

_WORD_RE = re.compile(r"\w+")


def repeated_ngrams(
    text: str, n: int = REPEAT_NGRAM, times: int = REPEAT_TIMES, copied: Sequence[tuple[int, int, str, int]] = ()
) -> Iterator[tuple[str, ...]]:
    """The word ``n``-grams ``text`` repeats ``times`` or more times, beyond what its sources
    repeat, each once, in the order the text reaches its last counted occurrence.

    Words are runs of word characters, each NFKC-normalised and lower-cased, so
    punctuation, markup and case do not hide a loop; occurrences may overlap
    (``"a a a a a a"`` holds ``"a a a a"`` three times). A larger ``n`` or
    ``times`` flags only longer loops and spares answers that list similar
    items (``reply.header('x-foo', ...)`` twice is not a loop).

    Args:
        copied: the stretches of ``text`` copied from a source, ``(start, end, document,
            document_start)`` (``_copied_sources``): characters ``start..end`` of ``text`` are
            those of ``document`` from ``document_start`` on. An occurrence that lies inside one was
            copied from one place of its source, and occurrences copied from different places are the
            source's own repetition (a changelog's links, an example's output lines), not the
            answer's: an n-gram is repeated when its occurrences outnumber the places they were
            copied from (at least one) by ``times - 1``. Without ``copied`` every occurrence counts.

    Raises:
        ValueError: if ``n`` or ``times`` is below 1 (when the first n-gram is asked for).
    """
    if n < 1 or times < 1:
        raise ValueError(f"n and times must be >= 1, got n={n}, times={times}")
    words = [(_fold(m.group()), m.start(), m.end()) for m in _WORD_RE.finditer(text)]
    seen: dict[tuple[str, ...], tuple[int, set[tuple[str, int]]]] = {}
    found: set[tuple[str, ...]] = set()
    for i in range(len(words) - n + 1):
        gram = tuple(word for word, _, _ in words[i : i + n])
        start, end = words[i][1], words[i + n - 1][2]
        count, places = seen.get(gram, (0, set()))
        places.update(
            (document, document_start + start - span_start)
            for span_start, span_end, document, document_start in copied
            if span_start <= start and end <= span_end
        )
        seen[gram] = (count + 1, places)
        if count + 1 - max(1, len(places)) >= times - 1 and gram not in found:
            found.add(gram)
            yield gram


def repeated_ngram(text: str, n: int = REPEAT_NGRAM, times: int = REPEAT_TIMES, copied: Sequence[tuple[int, int, str, int]] = ()) -> bool:
    """Whether ``text`` repeats some word ``n``-gram ``times`` or more times, beyond what its
    sources repeat (:func:`repeated_ngrams`, whose arguments these are; it stops at the first).

    Raises:
        ValueError: if ``n`` or ``times`` is below 1.
    """
    return next(repeated_ngrams(text, n, times, copied), None) is not None


def _copied_sources(output: Mapping[str, Any], doc_positions: Mapping[str, tuple[str, int]]) -> list[tuple[int, int, str, int]]:
    """``(start, end, document, document_start)`` of each copied span of ``output`` that can be
    located (int offsets, a string source id): characters ``start..end`` of its text are its
    document's from ``document_start`` on. ``doc_positions``: passage id -> ``(document id, offset
    of the passage in it)``; a passage it lacks is its own document."""
    located = []
    for span in _spans(output):
        source = span.get("source") if span.get("copied") else None
        start, end = span.get("start"), span.get("end")
        if not isinstance(source, Mapping) or not isinstance(start, int) or not isinstance(end, int):
            continue
        passage_id, (char_start, _) = source.get("id"), chunk_offsets(source)
        if isinstance(passage_id, str) and isinstance(char_start, int):
            doc, offset = doc_positions.get(passage_id, (passage_id, 0))
            located.append((start, end, doc, offset + char_start))
    return located


def recopied_source(
    output: Mapping[str, Any],
    doc_positions: Mapping[str, tuple[str, int]] | None = None,
    min_chars: int = RECOPY_MIN_CHARS,
) -> bool:
    """Whether two copied spans of ``output`` share ``min_chars`` or more characters of one source.

    Args:
        output: a generation following the output contract.
        doc_positions: passage id -> ``(document id, offset of the passage in
            it)``; with it, offsets are compared in document coordinates, so the
            overlapping chunks of one document (LangChain's 200-character
            overlap) count as one source. Without it (or for an id it lacks)
            each passage is its own source.
        min_chars: shared characters that make a re-copy; below about a word,
            copying the same short token twice ("`", "the") would count.

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``, or ``min_chars < 1``.
    """
    if min_chars < 1:
        raise ValueError(f"min_chars must be >= 1, got {min_chars}")
    ranges = sorted((doc, doc_start, doc_start + end - start) for start, end, doc, doc_start in _copied_sources(output, doc_positions or {}))
    furthest: dict[str, int] = {}  # per source, the largest end of the ranges seen so far
    for doc, start, end in ranges:
        if min(end, furthest.get(doc, start)) - start >= min_chars:
            return True
        furthest[doc] = max(end, furthest.get(doc, end))
    return False


def is_repetitive(output: Mapping[str, Any], doc_positions: Mapping[str, tuple[str, int]] | None = None) -> bool:
    """Whether ``output`` is a degenerate loop: its text repeats a word 4-gram 3 or
    more times beyond what its sources repeat (:func:`repeated_ngram` with
    :data:`REPEAT_NGRAM`, :data:`REPEAT_TIMES`, the copied spans as ``copied``: a
    changelog's links copied from three entries are the changelog's) or it copies the
    same source characters twice (:func:`recopied_source`, at least
    :data:`RECOPY_MIN_CHARS` shared). ``doc_positions``: passage id -> ``(document id,
    offset of the passage in it)``, so that overlapping chunks of one document are one
    source. The share of such outputs is the evaluation's repetition rate.

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``.
    """
    if recopied_source(output, doc_positions):
        return True
    return repeated_ngram(output["text"], copied=_copied_sources(output, doc_positions or {}))


GARBLED_LINE_RUN = 3
"""Lines in a row of at most one word each that make model text garbled (``def`` / ``read`` / ``(``)."""

_EMPTY_LINK = re.compile(r"\[[`\s]*\]|\]\[")
"""Link markup with nothing in it, or two links' brackets stitched together (``[`DefRaw`][][]``)."""
_STUTTER = re.compile(r"\b(\w+)(?:\W+\1\b){2}", re.IGNORECASE)
"""One word three times in a row (``double double double``)."""


def garbled_model_text(output: Mapping[str, Any]) -> list[str]:
    """The model-written pieces of ``output`` (spans not copied; an abstention's text aside) that
    read as degenerate rather than as writing: :data:`GARBLED_LINE_RUN` or more lines in a row of
    at most one word each, link markup with nothing in it or stitched to another, or a word three
    times in a row. A fluent sentence that is false is not caught here: it is no answer
    (``answer_recall``), not garbled text.

    Raises:
        ValueError: if ``output`` lacks ``spans``.
    """
    if not isinstance(output.get("spans"), Sequence):
        raise ValueError("output has no 'spans' list")
    if (output.get("stats") or {}).get("finish_reason") == "not_covered":
        return []
    garbled = []
    for span in output["spans"]:
        text = str(span.get("text", ""))
        if span.get("copied") or not text.strip():
            continue
        lines = [line.split() for line in text.splitlines() if line.strip()]
        run = longest = 0
        for words in lines:
            run = run + 1 if len(words) <= 1 else 0
            longest = max(longest, run)
        if longest >= GARBLED_LINE_RUN or _EMPTY_LINK.search(text) or _STUTTER.search(text):
            garbled.append(text)
    return garbled


# --------------------------------------------------------------------------- copied markup

MARKUP_KINDS: tuple[str, ...] = (
    "html_comment", "front_matter", "link_definition", "html_tag", "heading", "adornment", "explicit_markup",
    "footnote",
)
"""Markup a reader never quotes, found by :func:`markup_ranges`."""

_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_MARKUP_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("html_comment", re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)),
    ("front_matter", re.compile(r"\A\ufeff?---[ \t]*\n[\w-]+:.*?\n(?:---|\.\.\.)[ \t]*$", re.DOTALL | re.MULTILINE)),
    # Not a footnote's definition (`[^1]: The note.`): a reader sees its note (see "footnote").
    ("link_definition", re.compile(r"^ {0,3}\[(?!\^)[^\]\n]+\]:[ \t].*$", re.MULTILINE)),
    # HTML elements only, so TypeScript generics in prose (`Array<string>`) are not tags.
    (
        "html_tag",
        re.compile(
            r"</?(?:a|abbr|b|br|code|dd|details|div|dl|dt|em|h[1-6]|hr|i|img|kbd|li|ol|p|pre|span|strong|sub|"
            r"summary|sup|table|tbody|td|th|thead|tr|ul)\b[^<>]*>",
            re.IGNORECASE,
        ),
    ),
    # A heading's marks only: its title is what a reader sees above the section, and an answer
    # may carry it as the label of the section it copies (decoding.prepare.PlannedCopy).
    ("heading", re.compile(r"^ {0,3}#{1,6}(?=[ \t]|$)", re.MULTILINE)),
    # reStructuredText: a title's underline or overline, a transition (and a Markdown rule); four
    # characters or more, so a docstring's `"""` line in a code block is not one; indented by at
    # most three spaces, as neither a title nor a rule can be indented further (such a line is
    # code: a console table's dashes). Or a simple table's border: runs of `=` separated by
    # spaces (`=====  =====`), at any indentation (a table in a directive's body).
    ("adornment", re.compile(r"^(?: {0,3}([!-/:-@\[-`{-~])\1{3,}|[ \t]*=+(?:[ \t]+=+)+)[ \t]*$", re.MULTILINE)),
    # reStructuredText: a line of explicit markup, a footnote's or citation's opening aside (a reader
    # sees its note): a directive, a target, a substitution definition, a comment (cog's
    # `.. [[[end]]]` too); the `::` that announces a literal block written on a line alone
    # (docutils shows nothing of it); and a MyST target, `(label)=` on a line alone, Sphinx's
    # Markdown for `.. _label:`.
    (
        "explicit_markup",
        re.compile(r"^[ \t]*(?:\.\.(?:[ \t]*|[ \t]+(?!\[[^\]\s]*\](?:[ \t]|$))\S.*)|::[ \t]*|\([^()\n]+\)=[ \t]*)$", re.MULTILINE),
    ),
    # reStructuredText: what docutils does not show of the `::` ending a paragraph that announces a
    # literal block: the second colon after text ("Example::" shows "Example:"), the white space and
    # both colons after a space ("as follows ::" shows "as follows").
    ("explicit_markup", re.compile(r"(?<=[^\s:]:):(?=[ \t]*$)|(?<=\S)[ \t]+::(?=[ \t]*$)", re.MULTILINE)),
    # A colon fence's line: MyST's `:::{note}` (a Sphinx directive), markdown-it-container's `:::tip`
    # (VuePress, Docusaurus), and the `:::` that closes either; their body is text.
    ("explicit_markup", re.compile(r"^[ \t]*:{3,}(?:[ \t]*\{[^{}\n]+\}.*|[ \t]*[A-Za-z].*)?$", re.MULTILINE)),
    # Markdown: a footnote's marker, `[^1]:` opening its definition or `[^1]` in the text (the
    # note itself is text). Outside code spans only (see markup_ranges).
    ("footnote", re.compile(r"\[\^[^\]\s]+\]:?")),
)
_CODE_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n)[\s\S])*?(?<!`)\1(?!`)")
"""An inline code span: ``[^a-z]`` there is a regex character class, no footnote."""


def _fenced_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges of the fenced code blocks of ``text``, fence lines included; a
    block closes at the next fence of the same character (an unclosed one runs to the end)."""
    ranges: list[tuple[int, int]] = []
    opened: tuple[int, str] | None = None
    for match in _FENCE_RE.finditer(text):
        if opened is None:
            opened = (match.start(), match.group(1)[0])
        elif match.group(1)[0] == opened[1]:
            line_end = text.find("\n", match.end())
            ranges.append((opened[0], len(text) if line_end < 0 else line_end))
            opened = None
    if opened is not None:
        ranges.append((opened[0], len(text)))
    return ranges


def markup_ranges(text: str) -> list[tuple[int, int, str]]:
    """Character ranges ``(start, end, kind)`` of the markup in a Markdown or reStructuredText source text.

    Kinds (:data:`MARKUP_KINDS`): an HTML comment (``<!-- ... -->``, to the end
    when unclosed); YAML front matter (a ``---`` line opening the text, ``key:``
    lines, a closing ``---`` or ``...``); a link-reference definition line
    (``[id]: target``, a footnote's ``[^id]: note`` not); an HTML tag or anchor of a known HTML element
    (``<a id="x">``, ``</h1>``, ``<sup>``); a heading line's marks (``#`` to ``######``):
    a copy that crosses into the next section takes them, one that carries only the title
    of the section it copies does not; a line of one punctuation character repeated, indented
    by at most three spaces (a reStructuredText title's underline or overline, a transition, a
    Markdown rule; indented further it is code) or a
    reStructuredText simple table's border (``=====  =====``); a reStructuredText directive
    line (``.. code-block:: python``), target (``.. _label:``), substitution definition, comment
    (``.. [[[end]]]``; a footnote's opening ``.. [1]`` is not: its note is text) or ``::``
    line alone (a literal block's marker), and what docutils does not show of a paragraph's
    closing ``::`` (the second colon after text, or the white space and both after a space); a
    MyST target (``(label)=`` on a line alone); a colon fence's line (``:::{note}``, ``:::tip``,
    ``:::``); a
    Markdown footnote's marker (``[^1]:`` opening its definition, whose note is text, and a
    ``[^1]`` reference), outside inline code spans.
    Markup that starts inside a fenced code block is code, not markup (a shell
    ``# comment`` is no heading). A text cut from a document inside a code block
    cannot know it is fenced: its lines are read as prose.

    Returns:
        The ranges sorted by start (they may overlap: a heading holding a tag).
    """
    fenced = _fenced_ranges(text)
    code_spans = [match.span() for match in _CODE_SPAN_RE.finditer(text)] if "[^" in text else []
    found = [
        (match.start(), match.end(), kind)
        for kind, pattern in _MARKUP_RES
        for match in pattern.finditer(text)
        if not any(lo <= match.start() < hi for lo, hi in fenced)
        and not (kind == "footnote" and any(lo <= match.start() < hi for lo, hi in code_spans))
    ]
    return sorted(found)


def copied_markup(output: Mapping[str, Any], passages: Mapping[str, str]) -> list[str]:
    """The :data:`MARKUP_KINDS` that the copied spans of ``output`` take from their sources.

    A copied span takes a markup range of :func:`markup_ranges` of its source
    passage (``passages[source["id"]]``) when its ``[chunk_char_start, chunk_char_end)``
    shares at least one character with it: half an anchor counts. Spans whose
    source is unknown are skipped; what the LM writes itself never counts.

    Returns:
        The kinds found, in :data:`MARKUP_KINDS` order (``[]`` when none).

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``.
    """
    found: set[str] = set()
    ranges_of: dict[str, list[tuple[int, int, str]]] = {}
    for start, end, passage_id, passage_start in _copied_sources(output, {}):
        if passage_id not in passages:
            continue
        if passage_id not in ranges_of:
            ranges_of[passage_id] = markup_ranges(passages[passage_id])
        passage_end = passage_start + end - start
        found.update(kind for lo, hi, kind in ranges_of[passage_id] if lo < passage_end and passage_start < hi)
    return [kind for kind in MARKUP_KINDS if kind in found]


# --------------------------------------------------------------------------- model text in copied code

_INDENTED_LINE_RE = re.compile(r"^(?: {4}|\t)[ \t]*\S.*$", re.MULTILINE)


def _indented_blocks(text: str, outside: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character ranges of ``text``'s indented code: runs of lines indented by four spaces or a
    tab (blank lines between them kept in the run), none starting inside an ``outside`` range."""
    blocks: list[tuple[int, int]] = []
    for match in _INDENTED_LINE_RE.finditer(text):
        if any(lo <= match.start() < hi for lo, hi in outside):
            continue
        if blocks and not text[blocks[-1][1] : match.start()].strip():
            blocks[-1] = (blocks[-1][0], match.end())
        else:
            blocks.append(match.span())
    return blocks


def model_text_in_code(output: Mapping[str, Any]) -> list[str]:
    """The LM's own writing inside copied code: for each code block of ``output``'s text that
    holds copied text (a fenced block, fence lines included, or a run of lines indented by four
    spaces or a tab), the model-written characters in it that are neither white space nor fence
    lines as :func:`_fenced_ranges` reads them (the decoder sets a block's fences and the
    indentation a copy does not bring). An option the documentation never had (``pip install
    --no-use-cache``) reads there as the documentation's own. A block the LM wrote alone (no copied
    text in it) is not copied code. Spans are placed by their ``start`` / ``end`` in the text.

    Returns:
        The model-written pieces found, one per block and span (``[]`` when none).

    Raises:
        ValueError: if ``output`` lacks ``text`` or ``spans``.
    """
    spans = _spans(output)
    text = output["text"]
    fenced = _fenced_ranges(text)
    copied = [(span["start"], span["end"]) for span in spans if span.get("copied")]
    written = [(span["start"], span["end"]) for span in spans if not span.get("copied")]
    pieces = []
    for lo, hi in fenced + _indented_blocks(text, fenced):
        if not any(start < hi and lo < end for start, end in copied):
            continue
        for start, end in written:
            piece = text[max(lo, start) : min(hi, end)]
            if any(line.strip() and not _FENCE_RE.match(line) for line in piece.splitlines()):
                pieces.append(piece)
    return pieces


# --------------------------------------------------------------------------- unanswerable questions


def unanswerable_scores(output: Mapping[str, Any], unanswerable: bool) -> dict[str, Any]:
    """How a generation cites sources for a question the corpus does not answer.

    Returns:
        ``{"cited_unanswerable": attribution_ratio > 0, "unanswerable_attribution":
        attribution_ratio}`` for an unanswerable question (``attribution_ratio``
        from the output, 0 when absent): a copy there lends a corpus source to an
        answer the corpus does not hold. Both None for an answerable question,
        so averages run over the unanswerable ones only.
    """
    if not unanswerable:
        return {"cited_unanswerable": None, "unanswerable_attribution": None}
    attribution = float(output.get("attribution_ratio", 0.0))
    return {"cited_unanswerable": attribution > 0, "unanswerable_attribution": attribution}


# --------------------------------------------------------------------------- speed / aggregation


def tokens_per_forward(stats: Mapping[str, Any], generations: int = 1) -> float:
    """Generated tokens per decoding forward pass, the prefill of each of
    ``generations`` generations excluded (see
    :func:`nest_integrations.decoding.output.tokens_per_decoding_forward`).

    Plain autoregressive decoding gives about 1.0; speculative decoding more.

    Raises:
        ValueError: if either key is missing, negative, or ``forward_passes`` is 0.
    """
    try:
        new_tokens, passes = stats["new_tokens"], stats["forward_passes"]
    except KeyError as exc:
        raise ValueError(f"stats missing key {exc.args[0]!r}") from exc
    if new_tokens < 0 or passes < 0:
        raise ValueError(
            f"negative counts in stats: new_tokens={new_tokens}, forward_passes={passes}"
        )
    if passes == 0:
        raise ValueError("forward_passes is 0; tokens per forward pass is undefined")
    return tokens_per_decoding_forward(new_tokens, passes, generations)


def _is_number(value: Any) -> bool:
    """True for int, float and bool values (bools average as rates)."""
    return isinstance(value, (int, float))


def aggregate(rows: Sequence[Mapping[str, Any]], keys: Iterable[str]) -> dict[str, Any]:
    """Average per-item metric rows.

    Args:
        rows: per-item dicts of metric values.
        keys: metric names to average.

    Returns:
        ``{"count": len(rows), key: mean, ...}``. For each key the mean is over
        rows where the value is present and not ``None`` (bools count as 0/1, so
        a boolean check averages to a rate; NaN propagates); it is ``None`` when
        no row has a value.

    Raises:
        ValueError: if a key is ``"count"`` or a value is neither numeric nor None.
    """
    result: dict[str, Any] = {"count": len(rows)}
    for key in keys:
        if key == "count":
            raise ValueError("'count' is reserved in aggregate output")
        values = [row.get(key) for row in rows]
        values = [v for v in values if v is not None]
        for value in values:
            if not _is_number(value):
                raise ValueError(f"non-numeric value for {key!r}: {value!r}")
        result[key] = math.fsum(values) / len(values) if values else None
    return result
