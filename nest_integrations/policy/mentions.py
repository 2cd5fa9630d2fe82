"""Whether a question names something the documents never mention.

A question the documents do not answer often still retrieves passages that look close
(a question about PowerShell completion retrieves the bash completion section), and
no score over those passages tells it apart as surely as this: the question names
something -- a product, a library, an option -- that no passage of the corpus holds.
:class:`CorpusTerms` keeps the words of a whole corpus, folded (lower case, accents
removed), and :meth:`CorpusTerms.unmentioned` lists the names of a question that are
not all among them. A name is a word with a capital letter that does not open a
sentence (``TypeScript``, ``SQLAlchemy``, ``XL``, ``pyproject.toml``'s parts when
written ``PyProject``), or a word rare in English whatever its case (``syslog``,
``pydantic``, ``zstd``: :data:`RARE_WORD_ZIPF`). Common words a user phrases a question
with are not names, so a question in the user's own words is not turned away for them.

Only a decoder that knows its whole corpus can use it (a :class:`~nest_integrations.index.nest_index.NestIndex`);
over the passages a store has retrieved so far, an absent word proves nothing.
"""

from __future__ import annotations

import bisect
import functools
import re
from typing import Iterable

from .words import fold, is_acronym_run, stem

__all__ = ["CorpusTerms", "RARE_WORD_ZIPF", "question_names"]

RARE_WORD_ZIPF = 2.0
"""A word rarer than this in English is a name, written in any case. The scale is wordfreq's Zipf
frequency: log10 of the word's occurrences per billion words, so 2.0 is once in ten million
(``syslog`` 1.8, ``pydantic`` 0, ``coroutines`` 1.4; ``fish`` 4.9 and ``position`` 5.2 are common
words). Higher turns away more questions about things the documents never name, and more
questions that name in jargon what the documents word otherwise (``regex`` 2.2 over documents
that say "regular expression"); lower, fewer of both."""

_WORD = re.compile(r"[^\W_]+")
_NAME = re.compile(r"(?<![\w.])(?:[A-Za-z][\w.+#-]*[A-Z][\w+#-]*|[A-Z][\w+#-]+)")
"""A word holding a capital after its first character (``TypeScript``, ``XL``), or a capitalised one."""
_SENTENCE_START = re.compile(r"(?:^|[.?!:;]\s+|\n)\s*[\"'“‘(`*_]*")


def question_names(question: str) -> list[str]:
    """The names ``question`` gives, in order, once each: words with a capital letter that do
    not open a sentence (those are capitalised whatever they are), runs of them one space
    apart as one name (``Frida Kahlo``, ``JSON Web Token``; a run of acronyms, ``SSH URL``, is
    its words: :func:`~.words.is_acronym_run`), and the other words that are rare
    in English (:func:`is_rare_word`)."""
    openings = {m.end() for m in _SENTENCE_START.finditer(question)}
    runs: list[tuple[int, int]] = []
    for match in _NAME.finditer(question):
        if match.start() in openings:
            continue
        if runs and question[runs[-1][1] : match.start()] == " ":
            runs[-1] = (runs[-1][0], match.end())
        else:
            runs.append((match.start(), match.end()))
    runs += [
        (m.start(), m.end()) for m in _WORD.finditer(question)
        if not any(start <= m.start() < end for start, end in runs) and is_rare_word(m.group())
    ]
    names: list[str] = []
    for start, end in sorted(runs):
        name = question[start:end].strip(".-+#")
        for part in name.split() if is_acronym_run(name) else [name]:
            if part and part not in names:
                names.append(part)
    return names


def is_rare_word(word: str) -> bool:
    """Whether ``word`` (letters only: a word with a digit, ``http2``, is read as its parts'
    spelling elsewhere) is rarer in English than :data:`RARE_WORD_ZIPF`; words under three
    letters never are (``kw`` of ``kw_only``)."""
    if len(word) < 3 or not word.isalpha():
        return False
    from wordfreq import zipf_frequency

    return zipf_frequency(word, "en") < RARE_WORD_ZIPF


class CorpusTerms:
    """The folded words (:func:`~nest_integrations.policy.words.fold`) of every text of a corpus,
    and their stems (:func:`~nest_integrations.policy.words.stem`: ``recursing`` and ``recursion`` meet).

    Args:
        texts: the corpus, every passage of it (with its title): a word only some texts hold
            counts as mentioned.
    """

    def __init__(self, texts: Iterable[str]):
        words: set[str] = set()
        for text in texts:
            words.update(_WORD.findall(fold(text)))
        self.words = frozenset(words)

    # Stems and the sorted words are made on the first name a question gives that the corpus
    # does not hold as written: most questions give none, and a large corpus takes seconds.
    @functools.cached_property
    def stems(self) -> frozenset[str]:
        """The Snowball stems of :attr:`words`."""
        return frozenset(stem(word) for word in self.words)

    @functools.cached_property
    def _sorted_words(self) -> list[str]:
        return sorted(self.words)

    def __len__(self) -> int:
        return len(self.words)

    def mentions(self, name: str) -> bool:
        """Whether every word of ``name`` (``"JSON Web Token"``, ``"pyproject.toml"``) is in the corpus:
        as it is, as a word of the same stem (``"Token"`` for ``tokens``), or, three letters or more,
        as the start of a corpus word (``"Mac"`` for ``macOS``: a name is often the first part of
        a longer one)."""
        parts = _WORD.findall(fold(name))
        return bool(parts) and all(self._holds(part) for part in parts)

    def _holds(self, word: str) -> bool:
        if word in self.words or stem(word) in self.stems:
            return True
        if len(word) < 3:
            return False
        at = bisect.bisect_left(self._sorted_words, word)
        return at < len(self._sorted_words) and self._sorted_words[at].startswith(word)

    def unmentioned(self, question: str) -> list[str]:
        """The names ``question`` gives (:func:`question_names`) that the corpus never mentions."""
        return [name for name in question_names(question) if not self.mentions(name)]
