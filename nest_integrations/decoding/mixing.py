"""The mixture p_M at the positions one forward fed a row: :class:`Mixer` computes a :class:`Mixture`.

Each fed position has the LM's next-token distribution p_LM and its query vector q (the hidden
state at the datastore's key layer). In the datastore modes the kNN search over the generation's
:class:`~nest_integrations.store.candidates.CandidateSet` gives p_kNN and the RRC weight lambda;
p_M mixes them (docs/method.md, Decoder). The proposer draws from it, the verifier checks drafts
against it, and teacher-forced scoring reads it (:mod:`~nest_integrations.decoding.scoring`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from nest_integrations.core.config import NestConfig
from nest_integrations.core.mixture import distance_ratio, knn_distribution, mix, rrc_lambda
from .generation import Generation

__all__ = ["Mixer", "Mixture"]


@dataclass
class Mixture:
    """Mixture quantities at T positions: p_M (T, V), lambda (T,), neighbours."""

    p_m: torch.Tensor
    lam: torch.Tensor
    values: torch.Tensor  # (T, r) long, -1 where there is no neighbour
    entries: torch.Tensor  # (T, r) long
    ratio: torch.Tensor  # (T,) RRC distance ratio, 1 where there is no neighbour


class Mixer:
    """Mixes the LM's distribution with the kNN one of a generation's candidate set.

    Stateless between calls, so one object serves every row of a decoder from any thread.

    Args:
        rrc_parameters: ``config -> (alpha, tau)`` of the RRC mixture weight; called per
            mixture, so a calibration fitted after the mixer was made applies
            (:meth:`~nest_integrations.decoding.decoder.NestDecoder.rrc_parameters`).
    """

    def __init__(self, rrc_parameters: Callable[[NestConfig], tuple[float, float]]):
        self.rrc_parameters = rrc_parameters

    def mixture(self, logits: torch.Tensor, queries: torch.Tensor, gen: Generation) -> Mixture:
        """p_M, lambda and neighbours at each of T positions (one batched search).

        Args:
            logits: float32 (T, V), the LM's next-token logits at the fed positions.
            queries: float32 (T, d), the query vectors at the datastore's key layer.
            gen: the row's generation (its config and candidate set).

        Returns a :class:`Mixture`: p_M (T, V) and lambda (T,); without candidates
        p_M is p_LM, lambda 1 and there are no neighbours (r = 0).
        """
        config = gen.config
        p_lm = torch.softmax(logits, dim=-1)
        t = p_lm.shape[0]
        no_neighbours = torch.full((t, 0), -1, dtype=torch.long)
        if gen.candidates is None:
            return Mixture(p_lm, torch.ones(t), no_neighbours, no_neighbours, torch.ones(t))
        nb = gen.candidates.search(queries, config.token_k)
        p_knn = knn_distribution(nb.scores, nb.values, p_lm.shape[1], config.knn_temperature)
        if config.mode == "knnlm":
            lam = torch.full((t,), config.knnlm_lambda)
        else:
            lam = rrc_lambda(nb.scores, *self.rrc_parameters(config))
        has = torch.isfinite(nb.scores).any(-1)
        lam = torch.where(has, lam, torch.ones_like(lam))
        values = nb.values.masked_fill(~torch.isfinite(nb.scores), -1)
        return Mixture(mix(p_lm, p_knn, lam), lam, values, nb.entries, distance_ratio(nb.scores))
