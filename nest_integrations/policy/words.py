"""How the policy rules read words: one tokenizer for the gate, the copy policy and the conversation.

A word is a run of letters, digits and underscores (``\\w+``), so ``reply.redirect`` is two
words and ``JSONDecodeError`` one (the gate splits identifiers further where it needs their
parts). ``joined=True`` keeps apostrophes and hyphens inside a word, for the rules that count
the words a reader sees: "it's" and "set-cookie" are one word each there.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["fold", "folded_words", "split_words"]

_WORD = re.compile(r"\w+")
_JOINED_WORD = re.compile(r"[\w'-]+")


def split_words(text: str, *, joined: bool = False) -> list[str]:
    """The words of ``text`` as written, in order (see the module docstring for ``joined``)."""
    return (_JOINED_WORD if joined else _WORD).findall(text)


def folded_words(text: str, *, joined: bool = False) -> list[str]:
    """:func:`split_words`, case-folded: what the rules compare."""
    return [word.casefold() for word in split_words(text, joined=joined)]


def fold(text: str) -> str:
    """``text`` case-folded and without accents (``"Mahātmā"`` -> ``"mahatma"``): how the rules
    compare names written with and without them."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()
