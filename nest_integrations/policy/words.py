"""How the policy rules read words: one tokenizer and one stemmer for the gate, the selector, the
copy policy, the conversation and the names a corpus mentions.

A word is a run of letters, digits and underscores (``\\w+``), so ``reply.redirect`` is two
words and ``JSONDecodeError`` one (the gate splits identifiers further where it needs their
parts). ``joined=True`` keeps apostrophes and hyphens inside a word, for the rules that count
the words a reader sees: "it's" and "set-cookie" are one word each there.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from typing import Any

__all__ = ["fold", "folded_words", "is_acronym_run", "split_words", "stem"]

_WORD = re.compile(r"\w+")
_JOINED_WORD = re.compile(r"[\w'-]+")


def split_words(text: str, *, joined: bool = False) -> list[str]:
    """The words of ``text`` as written, in order (see the module docstring for ``joined``)."""
    return (_JOINED_WORD if joined else _WORD).findall(text)


def folded_words(text: str, *, joined: bool = False) -> list[str]:
    """:func:`split_words`, case-folded: what the rules compare."""
    return [word.casefold() for word in split_words(text, joined=joined)]


def is_acronym_run(name: str) -> bool:
    """Whether every word of ``name`` is an acronym: two or more letters, all upper case
    (``"SSH URL"``, ``"LFS API"``, ``"HTTP"``). Such a run is a thing and its kind ("an SSH
    URL", "the HTTPS REST server"), not one proper name: documentation writes its words apart
    ("a URL ... over SSH") where it never writes a person's name or a title apart."""
    words = split_words(name)
    return bool(words) and all(sum(ch.isalpha() for ch in word) >= 2 and word.isupper() for word in words)


def fold(text: str) -> str:
    """``text`` case-folded and without accents (``"Mahātmā"`` -> ``"mahatma"``): how the rules
    compare names written with and without them."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


@functools.lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """The Snowball English stem of a folded word: how the rules match the forms of a word
    ("slicings" and "slice", "recursing" and "recursion", "sorted" and "sort", "decode" and
    "decoded"). Cached: documentation repeats its words, and each stem is asked for many times
    a question."""
    stemmer, lock = _english_stemmer()
    with lock:  # a Snowball stemmer keeps the word it works on in itself
        return stemmer.stemWord(word)


@functools.lru_cache(maxsize=1)
def _english_stemmer() -> tuple[Any, threading.Lock]:
    import snowballstemmer  # lazily: a decoder that compares no words never loads it

    return snowballstemmer.stemmer("english"), threading.Lock()
