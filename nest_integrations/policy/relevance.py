"""The relevance gate: which retrieved passages NEST may copy from (beyond the paper).

Without a gate the paper's method copies from whatever the first stage
returns: with a person's own summary missing from the corpus, the nearest
tokens belong to another person's biography and relaxed speculative decoding
accepts them; a question the corpus does not cover copies a passage that
shares one word with it. The gate reads only the query and the passage
*text* -- never titles or other metadata, which users word in every way
(file stems, "apt-get.8", "slicings") or do not have at all.

A passage passes when all of these hold:

* **similarity**: its dense cosine similarity to the query reaches
  ``min_similarity`` and lies within ``similarity_margin`` of the best
  retrieved passage (the first stage often returns a clear winner followed by
  passages that only share the topic); a Markdown passage of several sections
  (a text splitter's chunk) has the similarity of its best section
  (:func:`passage_similarities`), since the embedder reads a text's opening only;
* **coverage**: the passage text contains at least ``min_coverage`` of the
  query's content words (stems, accents folded; question words and stopwords
  left out), unless its cosine reaches ``lexical_free_similarity`` (a close
  paraphrase: "folder" for "directory"). "reverse a string in JavaScript"
  against a Python sequence document covers 2 of 3 at cosine 0.32;
* **named things**, for every query: a name it mentions in a sentence that
  asks (:func:`~.conversation.asked_sentences`: a statement of the user's
  setting before the question is left out; a capitalised word after a line's
  first, a camelCase identifier: :func:`named_words`) that
  no retrieved passage holds means the corpus does not cover the question,
  and the gate keeps nothing (:func:`unmentioned_names`); so does a scoped code
  name ("@fastify/rate-limit", "reply.redirect") whose last part no retrieved
  passage writes (:func:`unmentioned_identifiers`);
* **names**, for any other query: every multi-word name it mentions
  (:func:`query_names`: "Chimamanda Ngozi Adichie") must occur in the
  passage text (:func:`mentions`): a question about a person the corpus does
  not hold is not answered from another writer's summary;
* **subject**, for a query that asks about someone or something by name
  (:func:`subject_name`: the biography task's "Marie Curie", "Tell me a bio of
  Ada Lovelace.", "Who was Alan Turing?"): instead of the coverage check,
  the passage's opening sentence must name it among its first words
  (anywhere in it for a passage at cosine >= 0.6: pen names).
  A passage mentions many people but opens with its own subject, so Pierre
  Curie's summary (cosine 0.68 against "Marie Curie", above several people's
  own summaries) stays out while Marie Curie's passes.

The thresholds and their measured trade-off are in docs/method.md (Knowing when not to copy).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence

from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.chunking import section_chunks, sentence_spans
from nest_integrations.corpus.markdown_structure import copy_layout
from nest_integrations.corpus.passages import Passage
from .conversation import asked_sentences
from .words import fold, is_acronym_run, split_words, stem

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.core.config import NestConfig

_STOPWORDS = frozenset(
    """a an and as at by de der di du for from in into of on onto or la le the to van von with without within
    is are was were be been being am do does did done doing have has had having can could would should will shall
    may might must i you we me my your our us it its this that these those there here what which who whom whose
    how why when where tell show give explain describe please about use using used get make way ways some any
    all each other than then so if not no yes one also just like want need know several another after before
    under over much many every only out up down""".split()
)
_PARENTHETICAL = re.compile(r"\([^)]*\)")
_LEAD_MAX_CHARS = 300

GateReason = Literal["nothing_relevant"]


def content_words(text: str) -> set[str]:
    """Stems of the words of ``text`` without stopwords, question words, single letters (the
    "s" of a possessive) and parentheticals.

    ``content_words("Constantin Brâncuși (sculptor)") == {"constantin", "brancusi"}``.
    """
    words = split_words(fold(_PARENTHETICAL.sub(" ", text)))
    return {stem(w) for w in words if len(w) > 1 and w not in _STOPWORDS and w not in _NAME_PARTICLES and not w.isdigit()}


_IDENTIFIER_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def text_stems(text: str) -> set[str]:
    """Stems of every word of ``text``, and of the parts of identifiers: "JSONDecodeError"
    and "read_text" also give "json", "decode", "error", "read", "text"."""
    words = split_words(text)
    parts = [part for word in words if "_" in word or not word.islower() for part in _IDENTIFIER_PARTS.findall(word)]
    return {stem(fold(w)) for w in words + parts}


def coverage(query: str, text: str) -> float:
    """Share of the query's content words that occur in ``text`` (1.0 for a query without any)."""
    wanted = content_words(query)
    if not wanted:
        return 1.0
    return len(wanted & text_stems(text)) / len(wanted)


_NAME_PARTICLES = frozenset(
    "of the de de' der den di du da das dos del della van von la le al el ibn bin bint y e zu ter ten".split()
)
_GROUP_NOUNS = frozenset("brothers sisters family twins".split())
"""Words that end a group's name ("the Lumière brothers") without naming anyone: like the
particles, a passage that shares only these with the query ("The Marx Brothers") is not about it."""
_PARTICLE_JOINED = re.compile(r"^(?:al|el|ad|as|at|an|ar|az|bi|ibn|bin|abu|d|l)[-'’]\w*[A-Z]")
"""A name word opened by a joined particle: "al-Ghazi", "bi-Amr", "d'Alembert"."""
_ROMAN_NUMERAL = re.compile(r"^(?=[ivxlc])(?:x{0,3}|xl|l|lx{1,3}|xc|c)(?:i{0,3}|iv|v|vi{1,3}|ix)$")
_SUBJECT_WINDOW = 15
"""A passage's subject is named among the first words of its opening sentence."""


def is_name_query(query: str) -> bool:
    """Whether ``query`` is a bare name ("Marie Curie", "Pedro I of Brazil", "Lorenzo de' Medici"):
    1 to 6 words, no question mark, every word but name particles (de, von, ibn, ...) capitalised."""
    words = query.strip().split()
    if not 1 <= len(words) <= 6 or "?" in query:
        return False
    named = [w for w in words if fold(w).strip(".,'") not in _NAME_PARTICLES]
    return bool(named) and all(w[:1].isupper() or _PARTICLE_JOINED.match(w) for w in named)


_ASKED_NAME = re.compile(
    r"\b(?i:bio(?:graphy)?|life|about|who\s+(?:is|was|were))\s+(?:of\s+)?(?:the\s+)?"
    r"(?P<name>[A-Z][\w'.-]*(?:\s+(?:[A-Z][\w'.-]*|(?:al|el|ad|as|at|an|ar|az|bi|ibn|bin|abu)-[A-Z][\w'.-]*"
    r"|of|de|de'|von|van|da|di|du|del|la|le|al|ibn|bin|the|brothers|sisters|family|twins))*)"
)


def subject_name(query: str) -> str | None:
    """The person or thing a query asks about by name, or None.

    A bare name ("Marie Curie") is its own subject; so is the name in "Tell me
    a bio of Ada Lovelace.", "the life of Pedro I of Brazil" or "Who was Alan
    Turing?". Trailing particles ("... of") are dropped.
    """
    if is_name_query(query):
        return query.strip()
    match = _ASKED_NAME.search(query)
    if not match:
        return None
    words = match.group("name").rstrip(".").split()
    while words and fold(words[-1]) in _NAME_PARTICLES:
        words.pop()
    if not [w for w in words if fold(w) not in _NAME_PARTICLES | _GROUP_NOUNS]:
        return None
    return " ".join(words)


def _name_parts(name: str) -> tuple[list[str], set[str]]:
    """``(words, numerals)`` of a name: folded words without particles, initials as their
    letter and a full stop ("Arthur C. Clarke" -> ["arthur", "c.", "clarke"]), up to its
    regnal numeral ("Richard I of England" -> ["richard"], {"i"})."""
    words, numerals = [], set()
    for match in re.finditer(r"[\w']+\.?", name):
        raw = match.group()
        word = fold(raw.rstrip("."))
        if word.strip("'") in _NAME_PARTICLES | _GROUP_NOUNS or not word:
            continue
        if _ROMAN_NUMERAL.match(word) and not raw.endswith("."):
            numerals.add(word)
            break  # a ruler's territory after the numeral is often left out ("William III and II, ...")
        if len(word) > 1:
            words.extend(split_words(word))
        elif word.isalpha():
            words.append(word + ".")
    return words, numerals


def lead(text: str) -> str:
    """The opening sentence of ``text`` (at most ``_LEAD_MAX_CHARS`` characters, parentheticals removed)."""
    head = _PARENTHETICAL.sub(" ", text.lstrip()[:_LEAD_MAX_CHARS])
    sentences = sentence_spans(head)
    return head[: sentences[0][1]] if sentences else head


@functools.lru_cache(maxsize=4096)
def given_name_forms(word: str) -> frozenset[str]:
    """A folded given name with its other English forms: "billy" -> {"billy", "william",
    "bill", ...}, from the hand-curated ``nicknames`` dataset (its nicknames and canonical
    names both ways). A passage often opens with the formal name of someone asked about
    by the familiar one ("William Franklin Graham Jr." for "Billy Graham")."""
    namer = _nick_namer()
    return frozenset({word} | namer.canonicals_of(word) | namer.nicknames_of(word))


@functools.lru_cache(maxsize=1)
def _nick_namer() -> Any:
    from nicknames import NickNamer  # lazily: a process that expands no given name never loads its tables

    return NickNamer()


def _matches(word: str, opening_word: str, first: bool) -> bool:
    """Whether a name word stands for an opening word: an initial ("g.") for any word with that
    letter ("Godfrey"), the first word in any of its forms (:func:`given_name_forms`), else itself."""
    if word.endswith("."):
        return opening_word.startswith(word[0])
    return opening_word in given_name_forms(word) if first else opening_word == word


def opening_words(text: str, *, whole_sentence: bool = False) -> list[str]:
    """The folded words where ``text`` names its subject: the first ``_SUBJECT_WINDOW`` words
    of its opening sentence (:func:`lead`), or all of that sentence."""
    words = split_words(fold(lead(text)))
    return words if whole_sentence else words[:_SUBJECT_WINDOW]


def _in_order(words: Sequence[str], opening: Sequence[str]) -> int:
    """Index in ``opening`` just past ``words`` found as an ordered subsequence, or -1
    (see :func:`_matches`)."""
    at = 0
    for i, word in enumerate(words):
        found = next((j for j in range(at, len(opening)) if _matches(word, opening[j], i == 0)), None)
        if found is None:
            return -1
        at = found + 1
    return at


def names_subject(name: str, text: str, *, whole_sentence: bool = False) -> bool:
    """Whether ``text`` opens with ``name`` as its subject.

    Every word of the name (particles aside; an initial as any word with its letter:
    "G. H. Hardy" is "Godfrey Harold Hardy", not "Thomas Hardy") must occur, in the
    name's order, among the first ``_SUBJECT_WINDOW`` words of the opening
    sentence ("Maria Salomea Skłodowska-Curie, known as Marie Curie, was...");
    "Alexander Pope" is not "Pope Alexander VI". Regnal numerals must match:
    "Pedro I of Brazil" is not "Pedro II of Brazil", "Túpac Amaru" not
    "Túpac Amaru II". A familiar given name matches its formal forms ("Tom Hanks"
    for "Thomas Jeffrey Hanks"); a byname that shares no word with the opening
    ("El Cid" for "Rodrigo Díaz de Vivar") does not pass: the price of keeping
    other people's summaries out (docs/method.md: Knowing when not to copy).

    ``whole_sentence``: the name may come anywhere in the opening sentence
    (the gate allows it for very similar passages: "Eric Arthur Blair was an
    English novelist ... who wrote under the pen name of George Orwell").
    """
    words, numerals = _name_parts(name)
    if not [w for w in words if not w.endswith(".")]:
        return False
    opening = opening_words(text, whole_sentence=whole_sentence)
    end = _in_order(words, opening)
    if end < 0:
        return False
    following = opening[end] if end < len(opening) else ""
    if _ROMAN_NUMERAL.match(following) and following not in numerals:
        return False
    return numerals <= set(opening)


_QUERY_NAME = re.compile(
    r"(?<=\s)[A-Z][\w'’.-]*(?:\s+(?:(?:of|de|von|van|da|di|du|del|la|le|al|ibn|bin)\s+)*[A-Z][\w'’.-]*)+"
)


def query_names(query: str) -> list[str]:
    """The multi-word names a question mentions after the first word of each of its sentences
    ("Chimamanda Ngozi Adichie" in "What novel did Chimamanda Ngozi Adichie write?"): runs of two
    or more capitalised words within a sentence, so "... in Fastify. How do I ..." names nothing.
    A run of acronyms ("an SSH URL", :func:`~.words.is_acronym_run`) is not a name: its words
    are each a named word (:func:`named_words`) instead."""
    unpossessed = re.sub(r"['’]s\b", " ,", query)  # "Tolkien's The Hobbit" is two names
    sentences = (unpossessed[start:end] for start, end in sentence_spans(unpossessed))
    names = (match.group().rstrip(".") for sentence in sentences for match in _QUERY_NAME.finditer(sentence))
    return [name for name in names if not is_acronym_run(name)]


def mentions_query_names(query: str, text: str) -> bool:
    """Whether ``text`` :func:`mentions` every :func:`query_names` name of ``query``: a passage
    that never names "William Blake" does not answer a question about him, however near its
    words ("What nationality was William Blake?" and William the Silent's "Dutch national")."""
    return all(mentions(named, text) for named in query_names(query))


def naming_passages(query: str, passages: Sequence[Passage]) -> list[Passage]:
    """The ``passages`` that mention every multi-word name ``query`` gives
    (:func:`mentions_query_names`), in order; when none does, those that mention any of them (a
    question about two people, "Who were Marie Curie and Alan Turing?", is answered from each
    one's passage). All of them for a query that gives no name."""
    names = query_names(query)
    every = [p for p in passages if all(mentions(name, p.text) for name in names)]
    return every or [p for p in passages if any(mentions(name, p.text) for name in names)]


def mentions(name: str, text: str) -> bool:
    """Whether ``text`` mentions every word of ``name`` as :func:`names_subject` reads them
    (particles aside, initials by their letter, the first word in any of its given-name
    forms: :func:`_matches`), but anywhere and in any order."""
    words, _ = _name_parts(name)
    present = set(split_words(fold(text)))
    return all(any(_matches(word, w, i == 0) for w in present) for i, word in enumerate(words))


_NAMED_WORD = re.compile(r"(?<=[\s(\"'])(?:[A-Z][\w+#-]*|[a-z]+[A-Z]\w*)")


def named_words(query: str) -> list[str]:
    """The words a query names things with: capitalised words other than a line's first
    ("Flask", "GraphQL", "Karikó") and camelCase identifiers ("removeHeader"), possessives
    and trailing punctuation dropped."""
    words = []
    for line in query.splitlines():
        first = re.match(r"\s*\S+", line)
        rest = line[first.end() :] if first else ""
        words += [re.sub(r"['’]s$", "", w).rstrip(".-") for w in _NAMED_WORD.findall(rest)]
    return [w for w in words if content_words(w)]


def unmentioned_names(query: str, passages: Sequence[Passage]) -> list[str]:
    """The :func:`named_words` of ``query`` that none of ``passages`` mentions (stems of its
    words and identifier parts; a given name in any of its forms).

    A question about something named that no retrieved passage mentions ("How do I register
    a Flask blueprint?" over Fastify's docs, "Which valley did Malala Yousafzai grow up in?"
    over summaries that do not hold her) is not one the corpus answers, however close its
    other words come: the gate then keeps nothing.
    """
    held: set[str] = set()
    for passage in passages:
        held |= text_stems(passage.text)
    return [
        word for word in named_words(query)
        if not content_words(word) <= held and not (given_name_forms(fold(word)) & held)
    ]


_PACKAGE_OR_MEMBER = re.compile(r"@?[A-Za-z_][\w-]*(?:(?:\.|/|::)[A-Za-z_][\w-]*)+|@[A-Za-z_][\w-]*")
"""A code name written with its scope: ``@fastify/rate-limit``, ``reply.redirect``, ``os.path.join``, ``std::vector``."""


_PACKAGE_NAME = re.compile(r"(?<![\w@/.:-])[a-z][a-z0-9]*(?:-[a-z0-9]+){2,}(?![\w-])")
"""A lower-case name of three or more hyphenated parts, ``winston-daily-rotate-file``: a package's
name (English compounds of three parts hold a stopword: "end-to-end", "state-of-the-art")."""


def scoped_identifiers(query: str) -> list[str]:
    """The last part of each scoped code name in ``query`` (:data:`_PACKAGE_OR_MEMBER`), case-folded:
    ``"rate-limit"`` for ``@fastify/rate-limit``, ``"redirect"`` for ``reply.redirect``
    (and ``"py"`` for a file name such as ``settings.py``), not for English alternatives
    written with a slash after a stopword (``on/off``, ``yes/no``); then each unscoped package
    name (:data:`_PACKAGE_NAME`) whose parts are no stopwords, whole."""
    names = []
    for match in _PACKAGE_OR_MEMBER.finditer(query):
        parts = re.split(r"\.|/|::|@", match.group())
        if "/" in match.group() and fold(parts[0]) in _STOPWORDS:
            continue  # English alternatives ("an on/off flag", "a yes/no question", "and/or"): no package is named "on"
        last = parts[-1].strip("-")
        if len(last) > 1:
            names.append(fold(last))
    unscoped = _PACKAGE_OR_MEMBER.sub(" ", query)
    names += [m.group() for m in _PACKAGE_NAME.finditer(unscoped) if not set(m.group().split("-")) & _STOPWORDS]
    return names


def unmentioned_identifiers(query: str, passages: Sequence[Passage]) -> list[str]:
    """The :func:`scoped_identifiers` of ``query`` that occur in none of ``passages`` as written
    (a whole word, hyphens included): a question about a package or member the corpus never
    names ("How do I limit requests with @fastify/rate-limit?" over documentation that has no
    "rate-limit") is not one it answers, even where every word of it appears somewhere
    ("rate", "limit"). Only the last part must occur: docstrings say ``dumps(obj)`` where a
    user writes ``json.dumps``."""
    held = " ".join(fold(p.text) for p in passages)
    return [name for name in scoped_identifiers(query) if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", held)]


READING_SECTION_WORDS = 200
"""Words (whitespace-separated) of the sections a long Markdown passage is read in
(:func:`reading_sections`). The dense embedder reads 256 word pieces of a text at most, so
a splitter's chunk of several sections (LangChain's 4,000 characters, LlamaIndex's 1,024
tokens) is judged by its opening alone unless it is read section by section. About the size
of a ``nest index build`` passage, which is therefore read whole."""


def reading_sections(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` character ranges of the sections ``text`` is read in: for Markdown
    (:func:`~nest_integrations.corpus.markdown_structure.copy_layout`) its
    :func:`~nest_integrations.corpus.chunking.section_chunks` of ``READING_SECTION_WORDS``
    words (a heading with its text, or sibling sections packed while they fit); the whole
    text when it is prose or fits one such section."""
    if copy_layout(text) is None:
        return [(0, len(text))]
    chunks = section_chunks(text, max_words=READING_SECTION_WORDS)
    return [(0, len(text))] if len(chunks) <= 1 else [(chunk.start, chunk.end) for chunk in chunks]


def passage_similarities(query: str, passages: Sequence[Passage], relevance: Relevance) -> list[float]:
    """The cosine of each passage to ``query`` (a :data:`~nest_integrations.core.similarity.Relevance`
    over the passages' texts); for a passage read in several sections (:func:`reading_sections`),
    the highest of its own cosine and its sections': a long chunk is as relevant as the part of
    it that answers. Texts are asked for in one call."""
    sections = []  # per passage, the texts of its sections when it has several
    for passage in passages:
        spans = reading_sections(passage.text)
        sections.append([passage.text[start:end] for start, end in spans] if len(spans) > 1 else [])
    texts = [p.text for p in passages] + [piece for pieces in sections for piece in pieces]
    cosines = [float(c) for c in relevance(query, texts)] if texts else []
    similarities, at = [], len(passages)
    for i, pieces in enumerate(sections):
        similarities.append(max([cosines[i], *cosines[at : at + len(pieces)]]))
        at += len(pieces)
    return similarities


@dataclass(frozen=True)
class GateDecision:
    """The passages a gate lets into the token datastore, and why none when it keeps nothing."""

    kept: list[Passage]
    reason: Optional[GateReason] = None


@dataclass(frozen=True)
class RelevanceGate:
    """Decides which retrieved passages NEST may copy from (see the module docstring).

    Args:
        min_similarity: dense cosine floor (all-MiniLM-L6-v2 over question and
            passage); -1 turns the similarity checks off.
        similarity_margin: keep passages whose cosine is within this of the
            best retrieved one; >= 2 keeps them all.
        min_coverage: share of the query's content words the passage text must
            hold; 0 turns the check off.
        strong_similarity: from this cosine on, a named subject may be named
            anywhere in the passage's opening sentence (pen names).
        lexical_free_similarity: from this cosine on, a passage needs no
            coverage (documentation questions: their answers' passages reach
            0.45-0.65, questions the corpus does not cover at most 0.36).
    """

    min_similarity: float = 0.3
    similarity_margin: float = 0.2
    min_coverage: float = 0.25
    strong_similarity: float = 0.6
    lexical_free_similarity: float = 0.45

    @classmethod
    def from_config(cls, config: "NestConfig") -> "RelevanceGate":
        """The gate of a :class:`~nest_integrations.core.config.NestConfig` (its ``min_passage_relevance``,
        ``relevance_margin`` and ``min_query_coverage``), as the decoder applies it."""
        return cls(config.min_passage_relevance, config.relevance_margin, config.min_query_coverage)

    def __post_init__(self) -> None:
        if not -1.0 <= self.min_similarity <= 1.0:
            raise ValueError(f"min_similarity must be in [-1, 1], got {self.min_similarity}")
        if self.similarity_margin < 0:
            raise ValueError(f"similarity_margin must be >= 0, got {self.similarity_margin}")
        if not 0.0 <= self.min_coverage <= 1.0:
            raise ValueError(f"min_coverage must be in [0, 1], got {self.min_coverage}")

    def passes(self, query: str, passage: Passage, similarity: float, best: float) -> bool:
        """Whether one passage passes, given the best similarity among the retrieved ones."""
        if self.min_similarity > -1.0 and (similarity < self.min_similarity or similarity < best - self.similarity_margin):
            return False
        name = subject_name(query)
        if name is not None:
            return names_subject(name, passage.text, whole_sentence=similarity >= self.strong_similarity)
        if not mentions_query_names(query, passage.text):
            return False
        return similarity >= self.lexical_free_similarity or coverage(query, passage.text) >= self.min_coverage

    def decide(self, query: str, passages: Sequence[Passage], relevance: Relevance) -> GateDecision:
        """The gate over ``passages`` with their similarities read by ``relevance``
        (:func:`passage_similarities`): what the decoder and the benches apply."""
        return self(query, passages, passage_similarities(query, passages, relevance) if passages else [])

    def __call__(self, query: str, passages: Sequence[Passage], similarities: Sequence[float]) -> GateDecision:
        """The passages that pass, in their original order.

        Args:
            query: the first-stage retrieval query; a follow-up's holds the earlier questions
                above the one asked now. Only the names of the sentences that ask, of the
                question asked now, must be mentioned (:func:`~.conversation.asked_sentences`,
                :func:`unmentioned_names`, :func:`unmentioned_identifiers`).
            passages: retrieved passages, best first.
            similarities: cosine similarity of each passage to ``query``
                (same length as ``passages``).
        """
        if len(passages) != len(similarities):
            raise ValueError(f"{len(passages)} passages but {len(similarities)} similarities")
        if not passages:
            return GateDecision([], "nothing_relevant")
        # What is asked, as the corpus-wide names check reads it: an earlier question's names ("a
        # transfer agent in Python") and a statement's ("Our tests run in Docker.") are the
        # user's setting, not what is asked now.
        asked = asked_sentences(query)
        if unmentioned_names(asked, passages) or unmentioned_identifiers(asked, passages):
            return GateDecision([], "nothing_relevant")
        best = max(similarities)
        kept = [p for p, s in zip(passages, similarities) if self.passes(query, p, float(s), float(best))]
        return GateDecision(kept, None if kept else "nothing_relevant")
