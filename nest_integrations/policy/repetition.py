"""Repetition guard: an answer never repeats a run of tokens it already holds.

A copy that re-enters text the answer has already copied (the same source, or
another chunk holding the same words) loops: the next kNN search finds the same
continuation again, and again. A small LM writing alone loops the same way. The
guard works on token ids, for copies and for the LM's own picks alike:

* :func:`repeat_free_length`: how much of a proposed span may be copied before it
  would complete an n-gram (``n`` tokens) that already occurs in the answer. The
  decoder cuts the draft there, so relaxed verification never sees the repeat.
* :func:`repeating_tokens`: the tokens that would complete such an n-gram as the
  next token; the decoder takes them out of p_M before it picks (the rule of
  transformers' ``NoRepeatNGramLogitsProcessor``).

The knob is ``n``, the shortest run that counts as a repeat: ``NestConfig.repeat_ngram``
(8 tokens, about five words) for copies, since a source may legitimately repeat a short
phrase ("of the United States" twice in one summary is four tokens), and
``NestConfig.lm_repeat_ngram`` (4) for the LM's own picks, whose short loops ("He is
also a poet laureate. He is a poet laureate.") are what a small LM writing alone falls into.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["repeat_free_length", "repeating_tokens"]


def _ngrams(tokens: Sequence[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def repeating_tokens(history: Sequence[int], n: int) -> set[int]:
    """Tokens that, appended to ``history``, would complete an ``n``-gram already in it.

    Args:
        history: the answer's token ids so far.
        n: n-gram length in tokens (>= 1; 0 or less disables the guard: empty set).
    """
    if n <= 0 or len(history) < n:
        return set()
    tail = tuple(history[len(history) - n + 1 :]) if n > 1 else ()
    return {
        history[i + n - 1]
        for i in range(len(history) - n + 1)
        if tuple(history[i : i + n - 1]) == tail
    }


def repeat_free_length(history: Sequence[int], span: Sequence[int], n: int) -> int:
    """How many leading tokens of ``span`` can follow ``history`` before one completes an
    ``n``-gram that already occurs in ``history`` or earlier in the span.

    Returns ``len(span)`` when nothing repeats (and always when ``n <= 0``); 0 when the
    span's first token already repeats.
    """
    if n <= 0:
        return len(span)
    seen = _ngrams(history, n)
    tokens = list(history[-(n - 1) :]) if n > 1 else []
    for i, token in enumerate(span):
        tokens.append(token)
        if len(tokens) >= n:
            gram = tuple(tokens[-n:])
            if gram in seen:
                return i
            seen.add(gram)
    return len(span)
