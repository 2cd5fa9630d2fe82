"""The probability arithmetic of NEST, as small pure functions over torch tensors.

Shapes: ``T`` positions (one per decoding step or per position of a proposed
span), ``r`` kept neighbours, ``V`` vocabulary size. Scores are
``s_j = -||q - k_j||^2`` (so ``|s_j|`` is a squared distance).
"""

from __future__ import annotations

import torch


def knn_distribution(scores: torch.Tensor, values: torch.Tensor, vocab_size: int, temperature: float) -> torch.Tensor:
    """p_kNN(w) = sum of softmax weights of neighbours whose value is w.

    The softmax is over squared distances *relative to the nearest one*:
    ``softmax(-(d_j / d_1) / temperature)``. Raw squared distances of a small
    LM are large, and so are the gaps between first and second neighbour
    (docs/method.md, kNN temperature, has SmolLM2's), so the
    paper's ``softmax(s / sqrt(d))`` is a one-hot spike on the first neighbour;
    dividing by ``d_1`` makes the knob scale-free across models and layers.
    With ``temperature=0.1`` a neighbour 10% farther than the nearest one gets
    ``e^-1`` of its weight. Masked neighbours (score ``-inf``) get zero weight.

    Args:
        scores: float (T, r), best first.
        values: long (T, r) token ids.
        temperature: > 0; smaller is peakier.

    Returns:
        float32 (T, V); rows with no neighbour are all zero.
    """
    dist = -scores.float()
    nearest = dist[:, :1].clamp_min(1e-6)
    logits = -(dist / nearest) / temperature
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    out = torch.zeros((scores.shape[0], vocab_size), dtype=torch.float32)
    if scores.shape[1]:
        out.scatter_add_(1, values, weights)
    return out


def distance_ratio(scores: torch.Tensor) -> torch.Tensor:
    """``min_j |s_j| / max_j |s_j|`` over the finite kept neighbours, float32 (T,).

    Near 0: the nearest key is far closer than the rest (retrieval is confident).
    Near 1: all kept keys are about equally far. Rows without neighbours give 1.
    """
    dist = -scores.float()
    if dist.shape[1] == 0:
        return torch.ones(dist.shape[0])
    finite = torch.isfinite(dist)
    d_min = torch.where(finite, dist, torch.full_like(dist, float("inf"))).min(-1).values
    d_max = torch.where(finite, dist, torch.zeros_like(dist)).max(-1).values
    ratio = d_min / d_max.clamp_min(1e-12)
    return torch.where(finite.any(-1), ratio, torch.ones_like(ratio))


def rrc_lambda(scores: torch.Tensor, alpha: float, tau: float) -> torch.Tensor:
    """Relative Retrieval Confidence: the LM's weight in the mixture.

    ``lambda = sigmoid((min_j |s_j| / max_j |s_j| - alpha) / tau)`` over the kept
    (finite) neighbours. A nearest key much closer than the farthest kept one
    gives a small ratio, a small lambda, and retrieval dominates. Positions
    with no neighbour get lambda = 1 (LM only).

    Args:
        scores: float (T, r).

    Returns:
        float32 (T,).
    """
    lam = torch.sigmoid((distance_ratio(scores) - alpha) / tau)
    no_neighbour = ~torch.isfinite(scores).any(-1) if scores.shape[1] else torch.ones(scores.shape[0], dtype=torch.bool)
    return torch.where(no_neighbour, torch.ones_like(lam), lam)


def mix(p_lm: torch.Tensor, p_knn: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """p_M = lambda * p_LM + (1 - lambda) * p_kNN, row-wise. (T, V), (T, V), (T,) -> (T, V)."""
    lam = lam.unsqueeze(-1)
    return lam * p_lm + (1.0 - lam) * p_knn


def relaxed_accept_ratio(p_m: torch.Tensor, tokens: torch.Tensor, gamma: float) -> torch.Tensor:
    """Acceptance probability ``min(1, p_M(x_i) / (gamma * max_w p_M(w)))`` per position.

    Args:
        p_m: float (T, V), the mixture at each span position.
        tokens: long (T,), the proposed tokens.
        gamma: leniency in (0, 1]; smaller accepts more.

    Returns:
        float32 (T,) in [0, 1].
    """
    chosen = p_m.gather(1, tokens.unsqueeze(-1)).squeeze(-1)
    return (chosen / (gamma * p_m.max(-1).values).clamp_min(1e-30)).clamp(max=1.0)


def accepted_prefix_length(ratios: torch.Tensor, threshold: float = 0.5) -> int:
    """Length of the leading run of positions whose acceptance ratio exceeds ``threshold``.

    Deterministic acceptance, as in the authors' setting; stops at the first rejection.
    """
    rejected = (ratios <= threshold).nonzero()
    return int(rejected[0, 0]) if len(rejected) else int(ratios.shape[0])
