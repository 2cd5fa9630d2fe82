"""The relevance gate: which retrieved passages NEST may copy from (beyond the paper).

With a person's own summary missing from the corpus, the paper's method still
copies: the nearest tokens belong to another person's biography, and relaxed
speculative decoding accepts them. The gate keeps a retrieved passage only when

* its dense cosine similarity to the retrieval query reaches
  ``min_passage_relevance`` **and** the query names the passage's subject
  (every content word of its title occurs in the query; untitled passages
  count as named), or
* its similarity reaches ``min_passage_relevance_unnamed`` (a passage so close
  to the query that naming does not matter).

Measured on SmolLM2 biographies over the Wikipedia summaries: own summaries
score 0.55-0.74 against the person's name, while passages about somebody else
reach 0.68 (Pierre Curie for "Marie Curie"), so no single cosine threshold
separates them; the entity check does.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Sequence

from .corpus import Passage

_STOPWORDS = frozenset(
    "a an and as at by de der di du for from in of on or la le the to van von".split()
)
_PARENTHETICAL = re.compile(r"\([^)]*\)")


def content_words(text: str) -> set[str]:
    """Lower-case, accent-free words of ``text`` without stopwords and parentheticals.

    ``content_words("Constantin Brâncuși (sculptor)") == {"constantin", "brancusi"}``.
    """
    text = unicodedata.normalize("NFKD", _PARENTHETICAL.sub(" ", text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    return {w for w in re.findall(r"\w+", text) if w not in _STOPWORDS}


def names_subject(query: str, passage: Passage) -> bool:
    """Whether ``query`` names the passage's subject (its title); True for untitled passages."""
    title = content_words(passage.title)
    return not title or title <= content_words(query)


def gate(
    query: str,
    passages: Sequence[Passage],
    similarities: Sequence[float],
    min_relevance: float,
    min_relevance_unnamed: float,
) -> list[Passage]:
    """The passages that pass the gate, in their original order (see module docstring)."""
    return [
        p
        for p, s in zip(passages, similarities)
        if s >= min_relevance_unnamed or (s >= min_relevance and names_subject(query, p))
    ]
