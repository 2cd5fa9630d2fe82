"""Fitting a window scorer on rows of candidate answer windows (``nest_benchmarks.window_rows``).

The selector's fit (``benchmarks/fit_selector.py``) and the result scripts that fit variants of it
(``results/gate-rules-and-window-scorers/window_scorers.py``,
``results/lm-likelihood-signals/token_match.py``) share these: a conditional logit over one
question's windows at a time (:func:`ranking_weights`), scaled to a probability
(:func:`fitted_weights`, :func:`fit`, or :class:`LinearScorer` over any columns), how many
answerable questions the chosen windows hold (:func:`selected_recall`), how well the best window
marks the unanswerable ones (:func:`abstention_auc`), and one variant's columns scored the
selector's way on design and held-out sets (:func:`score_variant`, :func:`variants_table`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from nest_integrations import NestConfig
from nest_integrations.policy.selection import AnswerSelector, choose_windows

from .report_files import markdown_table

__all__ = [
    "L2", "LinearScorer", "abstention_auc", "best_probabilities", "fit", "fitted_weights", "ranking_weights", "score_variant",
    "selected_recall", "variants_table",
]


L2 = 0.01
"""The conditional logit's penalty on its weights over standardized features: 0.001 and 0.1
moved the left-out sets' recall by -3 to +2 in all; this is the middle."""


def ranking_weights(rows: list[dict]) -> np.ndarray:
    """float64 (F,) weights of the conditional logit over the questions of ``rows`` that have a
    window holding the answer: ``-log(sum of softmax over the answer's windows)`` a question,
    averaged, plus ``L2`` times the squared weights of the standardized features."""
    ranked = [r for r in rows if not r["unanswerable"] and r["labels"].any()]
    features = [torch.tensor(r["features"], dtype=torch.float64) for r in ranked]
    labels = [torch.tensor(r["labels"], dtype=torch.bool) for r in ranked]
    pooled = torch.cat(features)
    mean, scale = pooled.mean(0), pooled.std(0) + 1e-6
    w = torch.zeros(pooled.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w], max_iter=300, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        total = sum(
            torch.logsumexp(s, 0) - torch.logsumexp(s[y], 0) for s, y in (((x - mean) / scale @ w, y) for x, y in zip(features, labels))
        )
        value = total / len(features) + L2 * (w @ w)
        value.backward()
        return value

    optimizer.step(loss)
    return (w.detach() / scale).numpy()


def fitted_weights(rows: list[dict]) -> tuple[np.ndarray, float]:
    """float64 (F,) logistic weights and the intercept fitted on ``rows`` (any F columns): the
    conditional logit's weights (:func:`ranking_weights`), scaled, with an intercept, by a
    logistic regression of the labels on their score."""
    weights = ranking_weights(rows)
    answerable = [r for r in rows if not r["unanswerable"] and len(r["labels"])]
    score = np.concatenate([r["features"] @ weights for r in answerable])[:, None]
    calibration = LogisticRegression(max_iter=5000).fit(score, np.concatenate([r["labels"] for r in answerable]))
    return weights * calibration.coef_[0][0], float(calibration.intercept_[0])


def fit(rows: list[dict]) -> AnswerSelector:
    """The selector fitted on ``rows`` of the selector's features (:func:`fitted_weights`)."""
    weights, bias = fitted_weights(rows)
    return AnswerSelector(tuple(float(w) for w in weights), bias)


def selected_recall(selector: AnswerSelector | LinearScorer, rows: list[dict], count: int = NestConfig().answer_windows) -> int:
    """Answerable questions whose ``count`` chosen windows (as AnswerSelector.select chooses:
    :func:`~nest_integrations.policy.selection.choose_windows`) hold the answer."""
    found = 0
    for r in rows:
        if r["unanswerable"] or not len(r["labels"]):
            continue
        chosen = choose_windows(r["candidates"], selector.probabilities(r["features"]), count)
        found += any(bool(r["labels"][i]) for i in chosen)
    return found


def best_probabilities(selector: AnswerSelector | LinearScorer, rows: list[dict]) -> list[tuple[float, bool]]:
    """(best window probability, unanswerable) of every question of ``rows`` (0.0 without a window)."""
    return [(float(selector.probabilities(r["features"]).max()) if len(r["labels"]) else 0.0, r["unanswerable"]) for r in rows]


class LinearScorer:
    """A logistic scorer fitted on ``rows`` of any number of columns (:func:`fitted_weights`),
    read as ``AnswerSelector`` is: ``probabilities`` of (N, F) features."""

    def __init__(self, rows: list[dict]) -> None:
        self.weights, self.bias = fitted_weights(rows)

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(np.asarray(features, dtype=np.float64) @ self.weights + self.bias)))


def abstention_auc(scorer: AnswerSelector | LinearScorer, rows: list[dict]) -> float | None:
    """ROC AUC of the best window's probability for the answerable against the unanswerable
    questions of ``rows`` (a low value marks "nothing answers"); None without both kinds."""
    best = best_probabilities(scorer, rows)
    kinds = {u for _, u in best}
    return round(float(roc_auc_score([not u for _, u in best], [p for p, _ in best])), 3) if len(kinds) == 2 else None


def score_variant(rows: Mapping[str, list[dict]], design: Sequence[str], held_out: Sequence[str]) -> dict:
    """One variant's columns (each row's ``features``) scored the selector's way: on each
    ``design`` set the answerable questions whose three chosen windows hold the answer under a
    fit over the *other* design sets (``left_out``), on each ``held_out`` set under the fit over
    all design sets (``held_out``), and that pooled fit's :func:`abstention_auc` on every set."""
    pooled = LinearScorer([r for name in design for r in rows[name]])
    return {
        "left_out": {name: selected_recall(LinearScorer([r for other in design if other != name for r in rows[other]]), rows[name]) for name in design},
        "held_out": {name: selected_recall(pooled, rows[name]) for name in held_out},
        "auc": {name: abstention_auc(pooled, rows[name]) for name in rows},
    }


def variants_table(answerable: Mapping[str, int], report: Mapping[str, dict]) -> str:
    """Two Markdown tables of variants scored by :func:`score_variant` (``report``: variant ->
    its scores; ``answerable``: set -> answerable questions): the windows that hold an answer per
    variant and set, with the design and held-out totals, then each variant's AUC."""
    names = list(answerable)
    held = {variant: {**r["left_out"], **r["held_out"]} for variant, r in report.items()}
    windows = markdown_table(
        ["variant", *(f"{n} ({answerable[n]})" for n in names), "design sets", "held out"],
        [[variant, *(held[variant][n] for n in names), sum(r["left_out"].values()), sum(r["held_out"].values())] for variant, r in report.items()],
    )
    aucs = markdown_table(
        ["variant (AUC)", *names], [[variant, *("–" if r["auc"][n] is None else r["auc"][n] for n in names)] for variant, r in report.items()]
    )
    return windows + "\n" + aucs
