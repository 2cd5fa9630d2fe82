"""Candidate answer windows of a question set's retrieved passages, as rows to fit or measure a
window scorer on: the fitted selector's features and whether each window holds a gold answer.

``benchmarks/fit_selector.py`` fits the selector on these rows; result scripts that compare other
window scorers with it (``results/lm-likelihood-signals/``) read the same rows.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.runner import set_items
from nest_integrations import NestIndex
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.selection import CandidateWindow, candidate_windows, window_features

__all__ = ["PASSAGE_K", "cached_domain_rows", "domain_rows"]

PASSAGE_K = 8
"""Passages the first stage retrieves per question: the decoder's default ``passage_k``."""


def domain_rows(
    index: NestIndex, qa: str, candidates_of: Callable[[Sequence[Passage]], list[CandidateWindow]] = candidate_windows
) -> list[dict]:
    """One row per question of ``qa`` (a markdown-qa JSONL path, or a bundled task's name) over
    ``index``: its id and query, the float (N, F) ``features`` of its N candidate windows
    (``window_features``), their bool (N,) ``labels`` (the window, under the section title the
    decoder copies before it, holds a gold answer), the N ``candidates`` and the retrieved
    ``passages`` they come from (best first), whether the question is
    ``unanswerable``, and whether a retrieved passage holds its answer (``retrieved``).
    ``candidates_of`` gives a question's candidate windows from its passages: the decoder's by
    default, another reading of them for a script that measures one."""
    rows = []
    for item in set_items(qa, index.passages, limits={}):
        passages = [p for p, _ in index.retrieve(item.query, PASSAGE_K)]
        candidates = candidates_of(passages)
        answers = item.meta.get("answers") or []
        features = window_features(item.query, candidates, passages, index.relevance)
        labels = np.array([bool(answers) and bool(answer_recall(c.title + "\n" + c.passage.text[c.start : c.end], answers)) for c in candidates])
        rows.append({
            "id": item.id, "query": item.query, "features": features, "labels": labels, "candidates": candidates, "passages": passages,
            "unanswerable": bool(item.meta.get("unanswerable")),
            "retrieved": bool(answers) and any(answer_recall(p.text, answers) for p in passages),
        })
    return rows


def cached_domain_rows(
    index_path: str, qa: str, cache_file: Optional[Path], candidates_of: Callable[[Sequence[Passage]], list[CandidateWindow]] = candidate_windows
) -> list[dict]:
    """:func:`domain_rows` of the index at ``index_path``, read from ``cache_file`` (a pickle) when
    it is there, else computed and written to it (nothing is cached when it is None)."""
    if cache_file is not None and cache_file.exists():
        return pickle.loads(cache_file.read_bytes())
    rows = domain_rows(NestIndex.load(index_path), qa, candidates_of)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_bytes(pickle.dumps(rows))
    return rows
