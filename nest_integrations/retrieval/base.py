"""Retriever protocol and the shared query/k handling.

Every retriever returns ``(Passage, score)`` pairs, best first, at most ``k``
per query. Scores are only comparable within one retriever (cosine for dense,
raw BM25 for sparse, fused values for hybrid).
"""

from __future__ import annotations

import abc
from typing import Protocol, Sequence, runtime_checkable

from nest_integrations.corpus.passages import Passage

ScoredPassage = tuple[Passage, float]


@runtime_checkable
class PassageRetriever(Protocol):
    """Anything that ranks passages for text queries.

    Contract: results are best first with at most ``k`` entries; an empty
    (or whitespace-only) query yields ``[]``; ``k <= 0`` raises ValueError;
    ``k`` larger than the corpus yields every passage the retriever matches
    (all passages for dense retrieval; those sharing a query term for BM25).
    """

    def retrieve(self, query: str, k: int) -> list[ScoredPassage]: ...

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]: ...


def check_k(k: int) -> None:
    """Raise ValueError unless ``k`` is a positive integer."""
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")


class BatchRetrieverMixin(abc.ABC):
    """Implements the :class:`PassageRetriever` contract around one hook.

    Subclasses implement :meth:`_retrieve_nonempty`, which only ever sees
    non-blank queries and a validated ``k``; this mixin validates ``k``,
    answers blank queries with ``[]`` and derives :meth:`retrieve` from
    :meth:`retrieve_batch`.
    """

    def retrieve(self, query: str, k: int) -> list[ScoredPassage]:
        """Top ``k`` passages for one query, best first."""
        return self.retrieve_batch([query], k)[0]

    def retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]:
        """Top ``k`` passages for each query, best first (``[]`` for blank queries)."""
        check_k(k)
        if isinstance(queries, str):
            raise ValueError("retrieve_batch expects a sequence of queries, not a single string")
        results: list[list[ScoredPassage]] = [[] for _ in queries]
        positions = [i for i, query in enumerate(queries) if query.strip()]
        if positions:
            found = self._retrieve_nonempty([queries[i] for i in positions], k)
            for i, hits in zip(positions, found):
                results[i] = hits
        return results

    @abc.abstractmethod
    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        """Ranked hits for each non-blank query; ``k >= 1`` may exceed the corpus size."""


def check_passages(passages: Sequence[Passage]) -> list[Passage]:
    """Return ``passages`` as a new list after checking it is non-empty with unique ids.

    Raises:
        ValueError: empty corpus or duplicate ids (the first duplicate is named).
    """
    passages = list(passages)
    if not passages:
        raise ValueError("cannot build a retriever over an empty corpus")
    seen: set[str] = set()
    for passage in passages:
        if passage.id in seen:
            raise ValueError(f"duplicate passage id {passage.id!r}; retrievers need unique ids")
        seen.add(passage.id)
    return passages


def index_text(passage: Passage) -> str:
    """The text a retriever indexes: ``"title: text"``, or ``text`` when there is no title."""
    return f"{passage.title}: {passage.text}" if passage.title else passage.text


def with_added(passages: Sequence[Passage], new: Sequence[Passage]) -> list[Passage]:
    """``passages + new`` after checking the combined ids are unique (ValueError otherwise)."""
    return check_passages([*passages, *new])


def without_ids(passages: Sequence[Passage], ids: Sequence[str]) -> list[Passage]:
    """``passages`` minus those whose id is in ``ids``, keeping order.

    Raises:
        ValueError: an id is not in the corpus, or nothing would remain.
    """
    drop = set(ids)
    unknown = drop - {p.id for p in passages}
    if unknown:
        raise ValueError(f"cannot remove unknown passage id(s) {sorted(unknown)[:5]}")
    kept = [p for p in passages if p.id not in drop]
    if not kept:
        raise ValueError("cannot remove every passage; build a new retriever instead")
    return kept
