"""Sparse lexical retrieval with BM25 (``bm25s``).

Text is lowercased, split into word tokens of >= 2 characters, and English
stopwords are dropped. If PyStemmer is installed, tokens are also Snowball
stemmed (better recall for inflected forms); otherwise no stemmer is used, so
no extra dependency is required. ``bm25s`` is imported lazily.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from nest_integrations.corpus.passages import Passage
from .base import BatchRetrieverMixin, ScoredPassage, check_passages, index_text, with_added, without_ids

if TYPE_CHECKING:
    import bm25s

logger = logging.getLogger(__name__)


def _english_stemmer() -> Any | None:
    """A PyStemmer English stemmer when PyStemmer is installed, else None."""
    try:
        import Stemmer
    except ImportError:
        logger.debug("PyStemmer not installed; BM25 runs without stemming")
        return None
    return Stemmer.Stemmer("english")


def _tokenize(texts: list[str], stemmer: Any | None, *, allow_empty: bool) -> list[list[str]]:
    """Lowercased, stopword-free (optionally stemmed) tokens per text.

    ``allow_empty=False`` maps a text without tokens to ``[""]`` (bm25s's empty
    token) so that an all-stopword passage can still be indexed.
    """
    import bm25s

    return bm25s.tokenize(
        texts, lower=True, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False, allow_empty=allow_empty
    )


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices (int64) of the ``min(k, n)`` largest entries of float (n,) ``scores``, best first.

    O(n) selection plus O(k log k) sorting; ties are broken by lower index
    (also at the k-th place), so results are deterministic.
    """
    assert scores.ndim == 1 and k >= 1, (scores.shape, k)
    n = scores.shape[0]
    k = min(k, n)
    kth = np.partition(scores, n - k)[n - k]
    above = np.flatnonzero(scores > kth)
    ties = np.flatnonzero(scores == kth)[: k - above.size]
    candidates = np.concatenate([above, ties])
    return candidates[np.lexsort((candidates, -scores[candidates]))]


class BM25Retriever(BatchRetrieverMixin):
    """BM25 (Lucene variant) over ``"title: text"`` of each passage.

    Scores are raw BM25 values (> 0, unbounded, corpus-dependent). Only
    passages sharing at least one (non-stopword) term with the query are
    returned, so a query with no term from the corpus vocabulary gives ``[]``
    and ``k`` larger than the corpus gives every matching passage. Returning
    zero-score passages would only add arbitrarily ordered noise (which would
    also distort rank fusion).

    Args:
        passages: the corpus (non-empty, unique ids).
        k1: term-frequency saturation; higher lets repeated terms count more
            (typical 1.2-2.0).
        b: length normalisation in [0, 1]; 1 fully penalises long passages, 0
            ignores length.
    """

    def __init__(self, passages: Sequence[Passage], *, k1: float = 1.5, b: float = 0.75) -> None:
        if k1 < 0:
            raise ValueError(f"k1 must be >= 0, got {k1}")
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b must be in [0, 1], got {b}")
        self.k1 = k1
        self.b = b
        self._stemmer = _english_stemmer()
        self._passages = check_passages(passages)
        self._model = self._build(self._passages)

    def _build(self, passages: Sequence[Passage]) -> "bm25s.BM25":
        import bm25s

        model = bm25s.BM25(k1=self.k1, b=self.b)
        model.index(_tokenize([index_text(p) for p in passages], self._stemmer, allow_empty=False), show_progress=False)
        return model

    @property
    def passages(self) -> list[Passage]:
        """The indexed passages (a copy)."""
        return list(self._passages)

    def __len__(self) -> int:
        return len(self._passages)

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        results = []
        for tokens in _tokenize(queries, self._stemmer, allow_empty=True):
            known = [t for t in tokens if t and t in self._model.vocab_dict]
            if not known:
                results.append([])
                continue
            scores = np.asarray(self._model.get_scores(known), dtype=np.float32)
            results.append([(self._passages[i], float(scores[i])) for i in top_k_indices(scores, k) if scores[i] > 0])
        return results

    def add(self, passages: Sequence[Passage]) -> None:
        """Append passages (ids must be new) and rebuild the index (IDF changes corpus-wide)."""
        combined = with_added(self._passages, passages)
        self._model = self._build(combined)
        self._passages = combined

    def remove(self, ids: Sequence[str]) -> None:
        """Remove passages by id and rebuild the index."""
        kept = without_ids(self._passages, ids)
        self._model = self._build(kept)
        self._passages = kept
