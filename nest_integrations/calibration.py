"""Fitting the RRC offset alpha and temperature tau to a model and corpus.

Procedure (``nest calibrate``): for ``n`` biographies, teacher-force the gold
summary as the answer to "Tell me a bio of {name}." and record the RRC distance
ratio ``d_min / d_max`` at every answer token, twice:

* *known*: the person's own summary is among the retrieved passages, so the
  corpus holds the next token;
* *unknown*: the person's own summary is excluded, so it does not.

alpha is the threshold on the ratio that best separates the two (balanced
accuracy), and tau spreads the sigmoid over the overlap of the two
distributions (a quarter of the gap between the known 75th and unknown 25th
percentiles, at least 0.01), so that lambda is low where the corpus knows the
next token and high where it does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .index import NestIndex


def best_threshold(known: np.ndarray, unknown: np.ndarray) -> tuple[float, float]:
    """Threshold t maximising balanced accuracy of ``ratio < t`` as "known".

    Args:
        known, unknown: float (n,) ratios. Returns (t, balanced accuracy).
    """
    candidates = np.unique(np.concatenate([known, unknown]))
    if len(candidates) == 0:
        raise ValueError("no ratios to calibrate on")
    best_t, best_acc = float(candidates[0]), -1.0
    for t in np.quantile(candidates, np.linspace(0, 1, 201)):
        acc = 0.5 * (np.mean(known < t) + np.mean(unknown >= t))
        if acc > best_acc:
            best_t, best_acc = float(t), float(acc)
    return best_t, best_acc


def fit_alpha_tau(known: np.ndarray, unknown: np.ndarray) -> dict[str, Any]:
    """alpha, tau and a description of both ratio distributions."""
    alpha, accuracy = best_threshold(known, unknown)
    spread = float(np.quantile(unknown, 0.25) - np.quantile(known, 0.75))
    tau = max(abs(spread) / 4.0, 0.01)
    quantiles = (0.1, 0.25, 0.5, 0.75, 0.9)
    return {
        "alpha": round(alpha, 4),
        "tau": round(tau, 4),
        "balanced_accuracy": round(accuracy, 4),
        "known_ratio_quantiles": {str(q): round(float(np.quantile(known, q)), 4) for q in quantiles},
        "unknown_ratio_quantiles": {str(q): round(float(np.quantile(unknown, q)), 4) for q in quantiles},
        "tokens": {"known": int(len(known)), "unknown": int(len(unknown))},
    }


def calibrate_rrc(index: "NestIndex", *, n: int = 20, max_new_tokens: int = 48, seed: int = 0) -> dict[str, Any]:
    """Measure ratios on ``n`` biographies of the index's corpus and fit alpha/tau.

    Args:
        max_new_tokens: answer tokens scored per biography (the gold summary's first ones).
    """
    from .evaluation.tasks import bio_items

    decoder = index.decoder()
    config = decoder.config
    items = bio_items(n, seed=seed, passages=index.passages)
    known, unknown = [], []
    for item in items:
        own = item.meta["passage_id"]
        answer_ids = index.lm.tokenizer(item.reference, add_special_tokens=False)["input_ids"][:max_new_tokens]
        answer = index.lm.tokenizer.decode(answer_ids)
        for exclude, sink in (((), known), ((own,), unknown)):
            hits = index.retrieve(item.query, config.passage_k, exclude_ids=exclude)
            scored = decoder.score(item.prompt, answer, query=item.query, passages=hits, mode="nest", min_passage_relevance=-1.0)
            sink.extend(scored.ratio.tolist())
    return fit_alpha_tau(np.asarray(known), np.asarray(unknown))
