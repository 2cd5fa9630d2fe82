"""Sparse lexical retrieval with BM25 (``bm25s``).

Text is lowercased, split into word tokens of >= 2 characters, and English
stopwords are dropped. Words are not stemmed: in the default hybrid first stage
the dense retriever already meets inflected forms, and stemming BM25's words
(Snowball, as the relevance rules read them) left the first stage's recall@8 the
same over the evaluation's documentation sets (results/bm25-stems). So BM25 ranks
the same whether or not a stemming package happens to be installed. ``bm25s`` is
imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from nest_integrations.corpus.passages import Passage
from .base import BatchRetrieverMixin, ScoredPassage, check_passages, index_text, with_added, without_ids

if TYPE_CHECKING:
    import bm25s


def _tokenize(texts: list[str], *, allow_empty: bool) -> list[list[str]]:
    """Lowercased, stopword-free tokens per text (not stemmed: see the module docstring).

    ``allow_empty=False`` maps a text without tokens to ``[""]`` (bm25s's empty
    token) so that an all-stopword passage can still be indexed.
    """
    import bm25s

    return bm25s.tokenize(texts, lower=True, stopwords="en", return_ids=False, show_progress=False, allow_empty=allow_empty)


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
        self._passages = check_passages(passages)
        self._model = self._build(self._passages)

    def _build(self, passages: Sequence[Passage]) -> "bm25s.BM25":
        import bm25s

        model = bm25s.BM25(k1=self.k1, b=self.b)
        model.index(_tokenize([index_text(p) for p in passages], allow_empty=False), show_progress=False)
        return model

    @property
    def passages(self) -> list[Passage]:
        """The indexed passages (a copy)."""
        return list(self._passages)

    def __len__(self) -> int:
        return len(self._passages)

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        results = []
        for tokens in _tokenize(queries, allow_empty=True):
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
