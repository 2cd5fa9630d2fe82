"""Teacher-forced scoring: per-token log p_M and log p_LM of a given continuation, in one forward.

:class:`TeacherForcedScorer` runs :meth:`~nest_integrations.decoding.decoder.NestDecoder.score`
after the decoder prepared the generation (retrieval, gate, candidates) and the prompt's ids;
it returns a :class:`TeacherForced`: what perplexity under the mixture and RRC calibration need.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .generation import Generation
from .mixing import Mixer
from .output import GenerationStats

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.key_reader import KeyReader
    from nest_integrations.model.lm import LoadedLM

logger = logging.getLogger(__name__)

__all__ = ["SCORE_CHUNK", "TeacherForced", "TeacherForcedScorer"]

SCORE_CHUNK = 256
"""Continuation positions whose p_M a scorer computes at once, by default. Beyond the one forward
(its activations and a (T, hidden) matrix of final hidden states), scoring holds a few
(chunk, vocabulary) float32 matrices, whatever the continuation's length T."""


@dataclass
class TeacherForced:
    """Per-token scores of a given continuation (see :meth:`~nest_integrations.decoding.decoder.NestDecoder.score`).

    ``logp_mixture``, ``logp_lm``, ``lam``, ``ratio``: float32 (T,) for the T
    continuation tokens ``token_ids``.
    """

    token_ids: list[int]
    logp_mixture: torch.Tensor
    logp_lm: torch.Tensor
    lam: torch.Tensor
    ratio: torch.Tensor

    def perplexity(self, *, lm_only: bool = False) -> float:
        logp = self.logp_lm if lm_only else self.logp_mixture
        return float(torch.exp(-logp.mean()))


class TeacherForcedScorer:
    """Scores continuations with one LM forward and a decoder's mixture.

    Memory is bounded independently of the continuation's length: the LM head and the mixture
    run on ``chunk`` positions at a time, from the final hidden states of the one forward. (A
    model whose logits are not its output embedding applied to the decoder's last hidden state,
    e.g. one with logit soft-capping, gets its full logit matrix from the forward instead; the
    mixture is still chunked.)

    Args:
        lm: the LM.
        reader: reads the query vectors at the datastore's key layer in the forward.
        cache_arg: the keyword under which the model's forward takes its KV cache.
        mixer: the decoder's mixer.
        chunk: continuation positions mixed at once (>= 1 used).
    """

    def __init__(self, lm: "LoadedLM", reader: "KeyReader", cache_arg: str, mixer: Mixer, chunk: int = SCORE_CHUNK):
        self.lm = lm
        self.reader = reader
        self.cache_arg = cache_arg
        self.mixer = mixer
        self.chunk = chunk
        self.vocab_size = int(lm.model.get_output_embeddings().weight.shape[0])
        self._head_ok: Optional[bool] = None  # see head_reproduces_logits

    def score(self, gen: Generation, prompt_ids: list[int], target: list[int]) -> TeacherForced:
        """log p_M and log p_LM of each ``target`` token after ``prompt_ids`` (its prompt and the
        targets before it), lambda and the RRC distance ratio ``d_min / d_max``, from ``gen``'s
        candidate set. ``target``: non-empty, fits the context after the prompt."""
        rows, queries, head = self._score_forward(prompt_ids + target[:-1], len(target), gen.stats)
        chunk = max(int(self.chunk), 1)
        logp_m, logp_lm, lam, ratio = [], [], [], []
        for lo in range(0, len(target), chunk):
            hi = min(lo + chunk, len(target))
            with torch.inference_mode():
                logits = head(rows[lo:hi])
            mixture = self.mixer.mixture(logits, queries[lo:hi], gen)
            ids = torch.tensor(target[lo:hi])
            p_true = mixture.p_m.gather(1, ids[:, None]).squeeze(1)
            p_lm_true = torch.softmax(logits, -1).gather(1, ids[:, None]).squeeze(1)
            logp_m.append(p_true.clamp_min(1e-30).log())
            logp_lm.append(p_lm_true.clamp_min(1e-30).log())
            lam.append(mixture.lam)
            ratio.append(mixture.ratio)
            del logits, mixture
        return TeacherForced(
            token_ids=target,
            logp_mixture=torch.cat(logp_m),
            logp_lm=torch.cat(logp_lm),
            lam=torch.cat(lam),
            ratio=torch.cat(ratio),
        )

    def _score_forward(self, ids: list[int], keep: int, stats: GenerationStats) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """The one forward of :meth:`score` over ``ids``.

        Returns, for the last ``keep`` positions, rows and query vectors (keep, d)
        float32, and ``head``: rows -> logits float32 (n, V). The rows are the
        decoder's final hidden states and ``head`` the output embedding when that
        reproduces the model's logits (checked once per scorer,
        :meth:`head_reproduces_logits`); otherwise the rows are the model's logits
        and ``head`` the identity.
        """
        model = self.lm.model
        if self.head_reproduces_logits():
            decoder, head = model.get_decoder(), model.get_output_embeddings()
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.lm.device)
            with torch.inference_mode(), self.lm.forward_lock, self.reader.capture() as captured:
                outputs = decoder(input_ids=input_ids, use_cache=False, **self.reader.forward_kwargs())
                keys = self.reader.keys_from(captured, outputs)
            stats.forward_passes += 1
            hidden = outputs.last_hidden_state[0, -keep:]
            return hidden, keys[0, -keep:].float().cpu(), lambda rows: head(rows).float().cpu()
        from transformers import DynamicCache

        logits, queries = self._forward(ids, DynamicCache(), stats, keep=keep)
        return logits, queries, lambda rows: rows

    def _forward(self, ids: list[int], cache: Any, stats: GenerationStats, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One LM call over ``ids`` with the KV cache ``cache``: :meth:`_score_forward`'s path
        for a model whose logits are not its output embedding of the last hidden state.

        Returns logits (keep, V) float32 and query vectors (keep, d) for the
        last ``keep`` positions.
        """
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.lm.device)
        with torch.inference_mode(), self.lm.forward_lock, self.reader.capture() as captured:
            outputs = self.lm.model(
                input_ids=input_ids,
                use_cache=True,
                **{self.cache_arg: cache},
                logits_to_keep=keep,
                **self.reader.forward_kwargs(),
            )
            keys = self.reader.keys_from(captured, outputs)
        stats.forward_passes += 1
        return outputs.logits[0, -keep:].float().cpu(), keys[0, -keep:].float().cpu()

    def head_reproduces_logits(self) -> bool:
        """Whether the output embedding applied to ``get_decoder()``'s last hidden state gives the
        model's logits (so :meth:`score` can apply the head chunk by chunk); checked once on 4 tokens."""
        if self._head_ok is not None:
            return self._head_ok
        ok = False
        model = self.lm.model
        try:
            decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
            head = model.get_output_embeddings()
            if decoder is not None and head is not None and decoder is not model:
                probe = torch.arange(1, 5, dtype=torch.long, device=self.lm.device)[None] % self.vocab_size
                with torch.inference_mode(), self.lm.forward_lock:
                    full = model(input_ids=probe, use_cache=False).logits[0].float()
                    mine = head(decoder(input_ids=probe, use_cache=False).last_hidden_state)[0].float()
                scale = float(full.abs().max()) or 1.0
                ok = full.shape == mine.shape and bool(torch.allclose(full, mine, rtol=1e-3, atol=1e-3 * scale))
        except Exception:  # any model that does not fit the pattern scores through its own logits
            logger.debug("score: the output embedding does not reproduce the logits; using the model's", exc_info=True)
            ok = False
        self._head_ok = ok
        return ok
