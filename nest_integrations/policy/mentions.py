"""Whether a question names something the documents never mention.

A question the documents do not answer often still retrieves passages that look close
(a question about PowerShell completion retrieves the bash completion section), and
no score over those passages tells it apart as surely as this: the question names
something -- a product, a library, an option -- that no passage of the corpus holds.
:class:`CorpusTerms` keeps the words of a whole corpus, folded (lower case, accents
removed), and :meth:`CorpusTerms.unmentioned` lists the names of a question that are
not all among them. A name is a word with a capital letter that does not open a
sentence (``TypeScript``, ``SQLAlchemy``, ``XL``, ``pyproject.toml``'s parts when
written ``PyProject``): common words a user phrases a question with are not names, so
a question in the user's own words is never turned away for them.

Only a decoder that knows its whole corpus can use it (a :class:`~nest_integrations.index.nest_index.NestIndex`);
over the passages a store has retrieved so far, an absent word proves nothing.
"""

from __future__ import annotations

import re
from typing import Iterable

from .words import fold

__all__ = ["CorpusTerms", "question_names"]

_WORD = re.compile(r"[^\W_]+")
_NAME = re.compile(r"(?<![\w.])(?:[A-Za-z][\w.+#-]*[A-Z][\w+#-]*|[A-Z][\w+#-]+)")
"""A word holding a capital after its first character (``TypeScript``, ``XL``), or a capitalised one."""
_SENTENCE_START = re.compile(r"(?:^|[.?!:;]\s+|\n)\s*[\"'“‘(`*_]*")


def question_names(question: str) -> list[str]:
    """The names ``question`` gives, in order, once each: words with a capital letter that do
    not open a sentence (those are capitalised whatever they are), and runs of them one space
    apart as one name (``Frida Kahlo``, ``JSON Web Token``)."""
    openings = {m.end() for m in _SENTENCE_START.finditer(question)}
    runs: list[tuple[int, int]] = []
    for match in _NAME.finditer(question):
        if match.start() in openings:
            continue
        if runs and question[runs[-1][1] : match.start()] == " ":
            runs[-1] = (runs[-1][0], match.end())
        else:
            runs.append((match.start(), match.end()))
    names: list[str] = []
    for start, end in runs:
        name = question[start:end].strip(".-+#")
        if name and name not in names:
            names.append(name)
    return names


class CorpusTerms:
    """The folded words (:func:`~nest_integrations.policy.words.fold`) of every text of a corpus.

    Args:
        texts: the corpus, every passage of it: a word only some texts hold counts as mentioned.
    """

    def __init__(self, texts: Iterable[str]):
        words: set[str] = set()
        for text in texts:
            words.update(_WORD.findall(fold(text)))
        self.words = frozenset(words)

    def __len__(self) -> int:
        return len(self.words)

    def mentions(self, name: str) -> bool:
        """Whether every word of ``name`` (``"JSON Web Token"``, ``"pyproject.toml"``) is in the corpus,
        in the singular or the plural (``"Token"`` for ``tokens``)."""
        parts = _WORD.findall(fold(name))
        return bool(parts) and all(self._holds(part) for part in parts)

    def _holds(self, word: str) -> bool:
        return word in self.words or word + "s" in self.words or (word.endswith("s") and word[:-1] in self.words)

    def unmentioned(self, question: str) -> list[str]:
        """The names ``question`` gives (:func:`question_names`) that the corpus never mentions."""
        return [name for name in question_names(question) if not self.mentions(name)]
