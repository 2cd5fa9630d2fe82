"""The NEST decoder: the entry points of generation over the modes base, rag, knnlm, nest and ra_nest.

:class:`NestDecoder` is a facade. Its entry points (:meth:`~NestDecoder.generate`,
:meth:`~NestDecoder.submit`, :meth:`~NestDecoder.agenerate`,
:meth:`~NestDecoder.generate_batch`, :meth:`~NestDecoder.stream`,
:meth:`~NestDecoder.astream`, :meth:`~NestDecoder.score`) check the prompt and
prepare each generation in the caller's thread (:meth:`~NestDecoder.prepare_row`):

* retrieval, then the relevance gate: which retrieved passages may be copied at
  all (:class:`~nest_integrations.policy.relevance.RelevanceGate`; none left:
  ``stats.fallback_reason`` says why, and a chat prompt gets a plain abstention,
  :mod:`~nest_integrations.decoding.abstention`, or with ``fallback="lm"`` the LM's own answer);
* for a question, when the gate kept anything, the answer windows of the retrieved passages
  that the fitted selector ranks best (:mod:`~nest_integrations.policy.selection`);
* the candidate set of the kept passages' (and the windows' passages') datastore entries,
  and where the answer opens (:mod:`~nest_integrations.decoding.prepare`: the start of the
  best kept passage for a named subject, the answer windows for a question);
* the prompt the LM reads (:meth:`~NestDecoder.format_prompt`: chat template,
  passages in the prompt in the rag modes) and its token ids, cut to fit the
  context (:meth:`~NestDecoder.encode_prompt`).

What happens at each step -- the mixture p_M, proposing a copied span, verifying
it, committing and the stop rules, the output contract -- is
:class:`~nest_integrations.decoding.step.StepRules` (``decoder.rules``), which the
row scheduler drives.

Generations share forward passes: :meth:`NestDecoder.generate_batch` and
concurrent callers (threads, :meth:`~NestDecoder.agenerate` tasks) run as rows
of one KV cache, each row verifying its own draft and advancing by its own
accepted length (:mod:`nest_integrations.decoding.batching`, the row scheduler;
:mod:`nest_integrations.decoding.batching_service`, one running batch per LM). Models with
sliding-window attention generate one prompt after another, each as a batch of
one in the caller's thread (:func:`~nest_integrations.decoding.batching.run_rows`): one
step loop serves every path.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch

from nest_integrations.core.config import DEFAULT_ALPHA, DEFAULT_TAU, MODES, NestConfig
from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.passages import Passage
from nest_integrations.model.key_reader import KeyReader
from nest_integrations.model.lm import cache_argument
from nest_integrations.policy.conversation import TRANSCRIPT_STOP, plain_transcript, question_asked_now, retrieval_query
from nest_integrations.policy.copy_policy import Window
from nest_integrations.policy.mentions import CorpusTerms
from nest_integrations.policy.relevance import GateDecision, RelevanceGate
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.datastore import EncodeStats, TokenDatastore
from .abstention import abstention_text
from .generation import Generation, StreamChunk, StreamCursor
from .output import GenerationStats, NestOutput
from .prepare import choose_answer_windows, plan_opening
from .spans import TokenRecord
from .step import StepRules

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.policy.calibration import Calibration
    from nest_integrations.retrieval.base import PassageRetriever
    from .batching import Row

logger = logging.getLogger(__name__)

Message = Mapping[str, str]
PromptLike = Union[str, Sequence[Message]]
ScoredPassages = Sequence[tuple[Passage, float]]


@dataclass
class TeacherForced:
    """Per-token scores of a given continuation (see :meth:`NestDecoder.score`).

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


class NestDecoder:
    """Generates attributed text with NEST over a passage retriever and a token datastore.

    Args:
        lm: the loaded LM (:func:`nest_integrations.model.lm.load_lm`).
        datastore: the token-level datastore built with the same LM.
        retriever: first-stage passage retriever; may be None when passages are
            passed per call (``passages=``), as the LangChain / LlamaIndex
            adapters do.
        config: default :class:`NestConfig`; per-call keyword overrides apply on top.
        relevance: optional cosine of texts to a query
            (:data:`~nest_integrations.core.similarity.Relevance`), asked about the
            retrieved passages' texts by the relevance gate
            (``config.min_passage_relevance``) and about candidate answer windows;
            None turns both off.
    """

    def __init__(
        self,
        lm: "LoadedLM",
        datastore: Optional[TokenDatastore] = None,
        retriever: Optional["PassageRetriever"] = None,
        config: Optional[NestConfig] = None,
        *,
        relevance: Optional[Relevance] = None,
        calibration: Optional["Calibration"] = None,
        calibrator: Optional[Callable[[], Optional["Calibration"]]] = None,
        corpus_terms: Optional[CorpusTerms] = None,
    ):
        self.lm = lm
        self.datastore = datastore
        self.retriever = retriever
        self.config = config or NestConfig()
        self.relevance = relevance
        self.calibration = calibration
        """alpha/tau fitted for this LM on the corpus (:mod:`~nest_integrations.policy.calibration`), used where
        the config leaves them None; None: :data:`~nest_integrations.core.config.DEFAULT_ALPHA` / ``DEFAULT_TAU``."""
        self._calibrator = calibrator
        self.corpus_terms = corpus_terms
        """The words of the whole corpus (:class:`~nest_integrations.policy.mentions.CorpusTerms`): a question
        that names something they never mention is not covered. None when the corpus is not known whole."""
        self._calibration_lock = threading.Lock()
        if datastore is not None and datastore.encoder.lm is not lm:
            if datastore.encoder.lm.fingerprint() != lm.fingerprint():
                raise ValueError("the datastore was built with another LM than the decoder's")
        key_layer = datastore.encoder.key_layer if datastore is not None else "ffn_input"
        self.reader = KeyReader(lm.model, key_layer)
        self.cache_arg = cache_argument(lm.model)
        """The keyword under which the model's forward takes its KV cache (:func:`~nest_integrations.model.lm.cache_argument`)."""
        self.vocab_size = int(lm.model.get_output_embeddings().weight.shape[0])
        self.eos_ids = self._find_eos_ids()
        """Token ids that end a generation: the tokenizer's EOS and the model's ``generation_config`` ones."""
        self._score_head_ok: Optional[bool] = None  # see _head_reproduces_logits
        self._supports_batching: Optional[bool] = None  # see _batches
        self.rules = StepRules(lm, datastore, self.reader, self.cache_arg, self.eos_ids, self.rrc_parameters)
        """The per-step rules of this decoder's generations (:class:`~nest_integrations.decoding.step.StepRules`):
        what the row scheduler drives, and what :meth:`score` mixes with."""

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt: PromptLike,
        *,
        query: Optional[str] = None,
        passages: Optional[ScoredPassages] = None,
        **overrides: Any,
    ) -> NestOutput:
        """Generate one attributed continuation.

        Concurrent calls on one LM (threads, :meth:`agenerate` tasks) decode
        together in shared forward passes (:mod:`~nest_integrations.decoding.batching_service`);
        a call alone decodes as a batch of one.

        Args:
            prompt: a string (wrapped in the chat template when the model has one
                and ``use_chat_template``) or a list of ``{"role", "content"}``
                messages.
            query: first-stage retrieval query; default the prompt (the last
                user message for message lists).
            passages: pre-retrieved ``(Passage, score)`` pairs, best first, used
                instead of the decoder's retriever.
            **overrides: any :class:`NestConfig` field for this call.
        """
        if self._batches:
            return self.submit(prompt, query=query, passages=passages, **overrides).result()
        output = None
        for chunk in self.stream(prompt, query=query, passages=passages, **overrides):
            output = chunk.output
        assert output is not None
        return output

    def submit(
        self,
        prompt: PromptLike,
        *,
        query: Optional[str] = None,
        passages: Optional[ScoredPassages] = None,
        **overrides: Any,
    ) -> "Future[NestOutput]":
        """Prepare one generation here (retrieval, gate, prompt checks: their errors
        raise now) and queue it to decode with the LM's other callers; the future
        resolves to its :class:`NestOutput`. Models that cannot share a batch
        (:func:`~nest_integrations.decoding.batching.supports_batching`) decode it now."""
        check_prompt(prompt)
        if not self._batches:
            future: "Future[NestOutput]" = Future()
            future.set_result(self.generate(prompt, query=query, passages=passages, **overrides))
            return future
        from .batching_service import shared_service

        return shared_service(self.rules).submit(self.prepare_row(prompt, query, passages, self._call_config(overrides)))

    async def agenerate(
        self,
        prompt: PromptLike,
        *,
        query: Optional[str] = None,
        passages: Optional[ScoredPassages] = None,
        **overrides: Any,
    ) -> NestOutput:
        """:meth:`generate` for asyncio: preparation runs in a worker thread, decoding
        in the LM's shared batch, and no thread waits for the result. Cancelling the
        awaiting task (``task.cancel()``, ``asyncio.wait_for``) takes the row out of
        the batch at its next step; a task cancelled while its row is prepared never
        queues it."""
        check_prompt(prompt)
        if not self._batches:
            return await asyncio.to_thread(self.generate, prompt, query=query, passages=passages, **overrides)
        from .batching_service import shared_service

        row = await asyncio.to_thread(self.prepare_row, prompt, query, passages, self._call_config(overrides))
        return await asyncio.wrap_future(shared_service(self.rules).submit(row))

    def generate_batch(
        self,
        prompts: Sequence[PromptLike],
        *,
        queries: Optional[Sequence[Optional[str]]] = None,
        max_batch: Optional[int] = None,
        **overrides: Any,
    ) -> list[NestOutput]:
        """Generate for several prompts in shared forward passes; each row advances by
        its own accepted length, and a row that finishes leaves room for the next
        prompt (:mod:`~nest_integrations.decoding.batching`). With greedy decoding (or a seed)
        this equals one-by-one generation.

        Args:
            max_batch: None: the rows join the LM's shared batch
                (:class:`~nest_integrations.decoding.batching_service.BatchingService`, up to its
                ``max_batch`` rows, together with any concurrent callers), each
                decoding as soon as it is prepared. A number: exactly this many
                rows at most share each forward, in a batch of this call's own
                run in this thread.

        Every prompt is checked (:func:`check_prompt`) before the first generation starts.

        Raises:
            TypeError: ``prompts`` is a string (or not a list), or a prompt has the wrong type.
            ValueError: a malformed prompt (named by its index), ``queries`` of another length,
                or ``max_batch`` < 1.
        """
        if isinstance(prompts, (str, bytes, Mapping)) or not isinstance(prompts, Sequence):
            raise TypeError(
                f"prompts must be a list of prompts (strings or message lists), got {type(prompts).__name__}; "
                "use generate() for a single prompt"
            )
        prompts = list(prompts)
        for i, prompt in enumerate(prompts):
            try:
                check_prompt(prompt)
            except (TypeError, ValueError) as err:
                raise type(err)(f"prompts[{i}]: {err}") from None
        if queries is not None and (isinstance(queries, (str, bytes)) or len(queries) != len(prompts)):
            got = "a string" if isinstance(queries, (str, bytes)) else f"{len(queries)} queries"
            raise ValueError(f"got {len(prompts)} prompts but {got}")
        if max_batch is not None and int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        queries = list(queries) if queries is not None else [None] * len(prompts)
        if not self._batches:
            return [self.generate(p, query=q, **overrides) for p, q in zip(prompts, queries)]
        config = self._call_config(overrides)
        if max_batch is None:
            from .batching_service import shared_service

            service = shared_service(self.rules)
            futures = [service.submit(self.prepare_row(p, q, None, config)) for p, q in zip(prompts, queries)]
            return [future.result() for future in futures]
        from .batching import batched_generate

        return batched_generate([self.prepare_row(p, q, None, config) for p, q in zip(prompts, queries)], max_batch=int(max_batch))

    def stream(
        self,
        prompt: PromptLike,
        *,
        query: Optional[str] = None,
        passages: Optional[ScoredPassages] = None,
        **overrides: Any,
    ) -> Iterator[StreamChunk]:
        """Yield text chunks with their spans as tokens are accepted.

        Concatenating the chunks' texts gives the output text, and
        :func:`~nest_integrations.decoding.spans.merge_spans` of their spans gives
        its spans. The last chunk carries the complete :class:`NestOutput`.
        Nothing runs before the first ``next``; closing the iterator early stops
        the generation.
        """
        check_prompt(prompt)
        config = self._call_config(overrides)
        if self._batches:
            from .batching_service import shared_service

            yield from shared_service(self.rules).stream(self.prepare_row(prompt, query, passages, config))
            return
        from .batching import run_rows

        prepared = self.prepare_row(prompt, query, passages, config)
        cursor = StreamCursor(self.rules)
        for _ in run_rows([prepared], max_batch=1):
            if (chunk := cursor.advance(prepared.gen)) is not None:
                yield chunk
        if prepared.error is not None:
            raise prepared.error
        assert prepared.output is not None
        yield cursor.last(prepared.output)

    async def astream(
        self,
        prompt: PromptLike,
        *,
        query: Optional[str] = None,
        passages: Optional[ScoredPassages] = None,
        **overrides: Any,
    ) -> AsyncIterator[StreamChunk]:
        """:meth:`stream` for asyncio: preparation runs in a worker thread, the chunks
        arrive from the LM's shared batch without a thread waiting for them."""
        check_prompt(prompt)
        config = self._call_config(overrides)
        if not self._batches:
            chunks = self.stream(prompt, query=query, passages=passages, **overrides)
            done = object()
            while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
                yield chunk  # type: ignore[misc]
            return
        from .batching_service import shared_service

        row = await asyncio.to_thread(self.prepare_row, prompt, query, passages, config)
        async for chunk in shared_service(self.rules).astream(row):
            yield chunk

    def prepare_row(
        self, prompt: PromptLike, query: Optional[str], passages: Optional[ScoredPassages], config: NestConfig
    ) -> "Row":
        """One generation made ready to decode in a batch: retrieval, gate, candidates,
        opening and the prompt's token ids (:class:`~nest_integrations.decoding.batching.Row`).
        The prompt is assumed checked (:func:`check_prompt`)."""
        from .batching import Row

        started = time.perf_counter()
        gen = Generation(config=self._with_transcript_stop(prompt, config))
        context = self._prepare(gen, prompt, query, passages)
        prompt_ids = self.encode_prompt(self.format_prompt(prompt, config, context), config, gen.stats)
        generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
        return Row(self.rules, gen, prompt_ids, generator, submitted=started)

    def _call_config(self, overrides: Mapping[str, Any]) -> NestConfig:
        config = self.config.updated(**overrides) if overrides else self.config
        if config.mode not in MODES:  # validated by pydantic; kept for clarity of the error
            raise ValueError(f"unknown mode {config.mode!r}; choose from {MODES}")
        return config

    @property
    def _batches(self) -> bool:
        """Whether this model's generations share batches (:func:`~nest_integrations.decoding.batching.supports_batching`)."""
        if self._supports_batching is None:
            from .batching import supports_batching

            self._supports_batching = supports_batching(self.lm.model)
        return self._supports_batching

    SCORE_CHUNK = 256
    """Continuation positions whose p_M :meth:`score` computes at once. Beyond the one forward
    (its activations and a (T, hidden) matrix of final hidden states), scoring holds a few
    (SCORE_CHUNK, vocabulary) float32 matrices, whatever the continuation's length T."""

    def score(
        self,
        prompt: PromptLike,
        continuation: str,
        *,
        query: Optional[str] = None,
        passages: Optional[ScoredPassages] = None,
        **overrides: Any,
    ) -> "TeacherForced":
        """Teacher-forced scoring of ``continuation`` after ``prompt`` in one forward.

        Returns, per continuation token, log p_M and log p_LM of the true token,
        lambda and the RRC distance ratio ``d_min / d_max`` -- what perplexity
        under the mixture and RRC calibration need. Uses the same retrieval,
        gate and mixture as :meth:`generate` (``mode`` decides the mixture).

        Memory is bounded independently of the continuation's length: the LM head
        and the mixture run on :attr:`SCORE_CHUNK` positions at a time, from the final
        hidden states of the one forward. (A model whose logits are not its output
        embedding applied to the decoder's last hidden state, e.g. one with logit
        soft-capping, gets its full logit matrix from the forward instead; the
        mixture is still chunked.) Tokens beyond the context are not scored
        (``token_ids`` says which are).

        Raises:
            TypeError / ValueError: a malformed prompt (:func:`check_prompt`), a
                continuation that is not a string, holds a lone surrogate or is empty.
        """
        check_prompt(prompt)
        if not isinstance(continuation, str):
            raise TypeError(f"continuation must be a string, got {type(continuation).__name__}")
        _check_text(continuation, "continuation")
        config = self.config.updated(**overrides) if overrides else self.config
        gen = Generation(config=config)
        context = self._prepare(gen, prompt, query, passages)
        prompt_ids = self.encode_prompt(self.format_prompt(prompt, config, context), config, gen.stats, strict=False)
        target = self.lm.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        if not target:
            raise ValueError("continuation is empty")
        # Scored tokens are those that fit the context after the prompt (``token_ids`` says which).
        target = target[: max(self.lm.context_length - len(prompt_ids), 1)]
        rows, queries, head = self._score_forward(prompt_ids + target[:-1], len(target), gen.stats)
        chunk = max(int(self.SCORE_CHUNK), 1)
        logp_m, logp_lm, lam, ratio = [], [], [], []
        for lo in range(0, len(target), chunk):
            hi = min(lo + chunk, len(target))
            with torch.inference_mode():
                logits = head(rows[lo:hi])
            step = self.rules.mixture(logits, queries[lo:hi], gen)
            ids = torch.tensor(target[lo:hi])
            p_true = step.p_m.gather(1, ids[:, None]).squeeze(1)
            p_lm_true = torch.softmax(logits, -1).gather(1, ids[:, None]).squeeze(1)
            logp_m.append(p_true.clamp_min(1e-30).log())
            logp_lm.append(p_lm_true.clamp_min(1e-30).log())
            lam.append(step.lam)
            ratio.append(step.ratio)
            del logits, step
        return TeacherForced(
            token_ids=target,
            logp_mixture=torch.cat(logp_m),
            logp_lm=torch.cat(logp_lm),
            lam=torch.cat(lam),
            ratio=torch.cat(ratio),
        )

    def _score_forward(self, ids: list[int], keep: int, stats: GenerationStats) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The one forward of :meth:`score` over ``ids``.

        Returns, for the last ``keep`` positions, rows and query vectors (keep, d)
        float32, and ``head``: rows -> logits float32 (n, V). The rows are the
        decoder's final hidden states and ``head`` the output embedding when that
        reproduces the model's logits (checked once per decoder,
        :meth:`_head_reproduces_logits`); otherwise the rows are the model's logits
        and ``head`` the identity.
        """
        model = self.lm.model
        if self._head_reproduces_logits():
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

    def _head_reproduces_logits(self) -> bool:
        """Whether the output embedding applied to ``get_decoder()``'s last hidden state gives the
        model's logits (so :meth:`score` can apply the head chunk by chunk); checked once on 4 tokens."""
        if self._score_head_ok is not None:
            return self._score_head_ok
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
        self._score_head_ok = ok
        return ok

    # ------------------------------------------------------------------ prompt
    def _find_eos_ids(self) -> set[int]:
        ids = set()
        for source in (self.lm.tokenizer.eos_token_id, getattr(self.lm.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return ids

    def ensure_calibration(self, config: NestConfig) -> float:
        """Fit the calibration now if ``config`` needs one (nest or ra_nest, alpha or tau left None),
        the decoder has none and was given a ``calibrator``: once, before the first such generation,
        so base and rag generations never pay for it. Returns the seconds spent waiting for the fit
        (0.0 when none was needed; an index or store built with its LM has one saved)."""
        if self.calibration is not None or self._calibrator is None or config.mode not in ("nest", "ra_nest"):
            return 0.0
        if config.alpha is not None and config.tau is not None:
            return 0.0
        started = time.perf_counter()
        with self._calibration_lock:
            if self.calibration is None and self._calibrator is not None:
                self.calibration = self._calibrator()
                self._calibrator = None
        return time.perf_counter() - started

    def rrc_parameters(self, config: NestConfig) -> tuple[float, float]:
        """(alpha, tau) of the RRC mixture weight: the config's, else the calibration's, else the defaults."""
        fitted = self.calibration
        alpha = config.alpha if config.alpha is not None else (fitted.alpha if fitted else DEFAULT_ALPHA)
        tau = config.tau if config.tau is not None else (fitted.tau if fitted else DEFAULT_TAU)
        return alpha, tau

    def format_prompt(self, prompt: PromptLike, config: NestConfig, context: Sequence[Passage] = ()) -> str:
        """The prompt text fed to the LM: the chat template (when used) around the
        messages, with ``context`` passages put before the request (rag modes).

        Raises:
            TypeError / ValueError: a malformed prompt (:func:`check_prompt`), or a
                ``system_prompt`` with a lone surrogate.
        """
        check_prompt(prompt)
        if config.system_prompt is not None:
            _check_text(config.system_prompt, "system_prompt")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if context:
            block = "\n\n".join(f"[{i}] {p.title}: {p.text}" if p.title else f"[{i}] {p.text}" for i, p in enumerate(context, 1))
            last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
            messages[last_user] = {
                **messages[last_user],
                "content": f"Use these passages:\n{block}\n\n{messages[last_user]['content']}",
            }
        tokenizer = self.lm.tokenizer
        if not self._is_chat(prompt, config):
            return "\n\n".join(m["content"] for m in messages)
        if not getattr(tokenizer, "chat_template", None):  # a base model: the conversation as plain text
            return plain_transcript(messages, config.system_prompt)
        if config.system_prompt is not None and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": config.system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    MIN_PROMPT_TOKENS = 16
    """A prompt is cut to fit the context (its last tokens are kept), but never to fewer than
    this many tokens (or its whole length when shorter): a ``max_new_tokens`` that leaves
    less room is an error, not a generation that has lost its prompt."""

    def encode_prompt(self, text: str, config: NestConfig, stats: GenerationStats, *, strict: bool = True) -> list[int]:
        """Token ids of the formatted prompt ``text``, cut so the generation fits the context.

        A prompt longer than ``config.max_prompt_tokens`` or than the context leaves
        after ``config.max_new_tokens`` keeps its last tokens (``stats.prompt_truncated``,
        with a warning), so prompt plus generated tokens never exceed the context
        length and the generation stops inside it.

        Raises:
            ValueError: (``strict``) ``max_new_tokens`` leaves room for fewer than
                ``min(prompt tokens, MIN_PROMPT_TOKENS)`` prompt tokens. Without
                ``strict`` (scoring, which generates nothing) the prompt keeps that
                minimum and the scored continuation is what fits after it.
        """
        ids = self.lm.tokenizer(text, add_special_tokens=not text.startswith(self.lm.tokenizer.bos_token or "\0"))[
            "input_ids"
        ]
        if not ids:  # empty plain-text prompt: start from BOS (or EOS when there is none)
            start = self.lm.tokenizer.bos_token_id
            ids = [start if start is not None else next(iter(self.eos_ids), 0)]
        context = self.lm.context_length
        room = context - config.max_new_tokens
        needed = min(len(ids), self.MIN_PROMPT_TOKENS)
        if room < needed:
            if strict:
                raise ValueError(
                    f"max_new_tokens={config.max_new_tokens} does not fit the model's context of {context} tokens "
                    f"with this prompt of {len(ids)} tokens (at least {needed} of them are kept); "
                    f"use max_new_tokens <= {context - needed}"
                )
            room = needed
        limit = min(config.max_prompt_tokens or room, room)
        if len(ids) > limit:
            logger.warning("prompt has %d tokens; keeping its last %d", len(ids), limit)
            ids = ids[-limit:]
            stats.prompt_truncated = True
        stats.prompt_tokens = len(ids)
        return ids

    @staticmethod
    def _default_query(prompt: PromptLike) -> str:
        """The prompt itself, or for messages the conversation's query (:func:`retrieval_query`)."""
        if isinstance(prompt, str):
            return prompt
        return retrieval_query(prompt) or (str(prompt[-1].get("content") or "") if prompt else "")

    def _with_transcript_stop(self, prompt: PromptLike, config: NestConfig) -> NestConfig:
        """``config``, plus the stop string :data:`~nest_integrations.policy.conversation.TRANSCRIPT_STOP` when
        the prompt is read as a plain transcript: a base model writes the user's next turn itself."""
        if self._is_chat(prompt, config) and not getattr(self.lm.tokenizer, "chat_template", None):
            if TRANSCRIPT_STOP not in config.stop:
                return config.updated(stop=[*config.stop, TRANSCRIPT_STOP])
        return config

    @staticmethod
    def _is_chat(prompt: PromptLike, config: NestConfig) -> bool:
        """Whether the prompt is a conversation (messages, or a string with ``use_chat_template``) rather
        than text to continue; a model without a chat template reads it as a plain transcript."""
        return not isinstance(prompt, str) or config.use_chat_template

    # ------------------------------------------------------------------ retrieval
    def _retrieve(self, query: str, passages: Optional[ScoredPassages], config: NestConfig) -> list[tuple[Passage, float]]:
        if passages is not None:
            return list(passages)[: config.passage_k]
        if self.retriever is None or not query.strip():
            return []
        return list(self.retriever.retrieve(query, config.passage_k))

    def _gate(self, query: str, hits: list[tuple[Passage, float]], config: NestConfig) -> GateDecision:
        """Passages allowed into the token datastore: those relevant to the query (:class:`RelevanceGate`),
        or all of them when the gate is off (no relevance function, an empty query)."""
        passages = [p for p, _ in hits]
        if config.min_passage_relevance <= -1.0 or self.relevance is None or not hits or not query.strip():
            return GateDecision(passages)
        decision = RelevanceGate.from_config(config).decide(query, passages, self.relevance)
        if len(decision.kept) < len(hits):
            logger.info("relevance gate kept %d of %d passages", len(decision.kept), len(hits))
        return decision

    # ------------------------------------------------------------------ preparation
    def _prepare(self, gen: Generation, prompt: PromptLike, query: Optional[str], passages: Optional[ScoredPassages]) -> list[Passage]:
        """First stage: retrieve, gate, build the candidate set and plan the opening
        (:func:`~nest_integrations.decoding.prepare.plan_opening`); returns the
        prompt passages (rag modes). A datastore mode without entries records why in
        ``stats.fallback_reason`` and abstains (:meth:`_abstains`) or generates with the LM alone."""
        config = gen.config
        stats = gen.stats
        context: list[Passage] = []
        if config.mode == "base":
            return context
        t0 = time.perf_counter()
        q = query if query is not None else self._default_query(prompt)
        hits = self._retrieve(q, passages, config)
        stats.retrieval_s = time.perf_counter() - t0
        if config.uses_prompt_passages:
            context = [p for p, _ in hits[: config.rag_passages]]
        if not config.uses_datastore:
            return context
        stats.calibration_s = self.ensure_calibration(config)
        unmentioned = self._unmentioned(prompt, q, config)
        decision = GateDecision([]) if unmentioned else self._gate(q, hits, config)
        windows = self._answer_windows(prompt, q, hits, config) if decision.kept else []
        kept_ids = {p.id for p in decision.kept}
        answering = {w.passage_id for w in windows} - kept_ids
        gated = decision.kept + [p for p, _ in hits if p.id in answering]
        stats.retrieval_s = time.perf_counter() - t0 - stats.calibration_s
        stats.gate_retrieved, stats.gate_kept = len(hits), len(decision.kept)
        gen.candidates = self._candidates(gated, config, stats)
        if gen.candidates is None or len(gen.candidates) == 0:
            gen.candidates = None
            if passages is None and self.retriever is None:
                stats.fallback_reason = "no_retriever"
            elif not hits:
                stats.fallback_reason = "nothing_retrieved"
            elif unmentioned:
                stats.fallback_reason = "not_mentioned"
            elif decision.reason is not None:
                stats.fallback_reason = decision.reason
            else:
                stats.fallback_reason = "empty_datastore"
            if self._abstains(prompt, config, stats.fallback_reason):
                self._abstain(gen, [p for p, _ in hits], unmentioned)
            else:
                logger.info("no datastore entries for this prompt (%s): generating with the LM alone", stats.fallback_reason)
            return context
        stats.copied_from_datastore = True
        if config.mode not in ("nest", "ra_nest"):
            return context
        if self._is_chat(prompt, config):
            plan_opening(gen, q, gated, self.datastore, windows)  # type: ignore[arg-type]
        else:
            gen.lead_in = str(prompt)
        return context

    def _answer_windows(self, prompt: PromptLike, query: str, hits: ScoredPassages, config: NestConfig) -> list[Window]:
        """The windows a question's answer copies in nest and ra_nest (``config.answer_windows`` of
        them, best first), chosen among the retrieved passages (``hits``, best first) by
        :func:`~nest_integrations.decoding.prepare.choose_answer_windows`; none for a prompt that
        is no chat request."""
        if config.mode not in ("nest", "ra_nest") or not self._is_chat(prompt, config):
            return []
        return choose_answer_windows(query, [p for p, _ in hits], self.relevance, config)

    def _unmentioned(self, prompt: PromptLike, query: str, config: NestConfig) -> list[str]:
        """The names the question asked now gives that the corpus never mentions
        (:meth:`~nest_integrations.policy.mentions.CorpusTerms.unmentioned`; a follow-up's ``query``
        holds the earlier questions above it); none for a prompt that is no chat question, in a
        mode that copies nothing, or when the decoder does not know its whole corpus."""
        if self.corpus_terms is None or config.mode not in ("nest", "ra_nest") or not self._is_chat(prompt, config):
            return []
        return self.corpus_terms.unmentioned(question_asked_now(query))

    def _abstains(self, prompt: PromptLike, config: NestConfig, reason: Optional[str]) -> bool:
        """Whether a generation with nothing to copy answers with a plain abstention
        (:mod:`~nest_integrations.decoding.abstention`): a chat prompt in nest or ra_nest whose
        retrieval found nothing, whose gate kept nothing, or that names something the corpus never
        mentions, unless ``config.fallback`` is ``"lm"``."""
        return (
            config.fallback == "abstain" and config.mode in ("nest", "ra_nest") and self._is_chat(prompt, config)
            and reason in ("nothing_retrieved", "nothing_relevant", "not_mentioned")
        )

    def _abstain(self, gen: Generation, retrieved: Sequence[Passage], unmentioned: Sequence[str] = ()) -> None:
        """Finish ``gen`` before its first step with :func:`~nest_integrations.decoding.abstention.abstention_text`
        of the ``retrieved`` passages and the ``unmentioned`` names (``finish_reason`` ``"not_covered"``,
        nothing copied)."""
        text = abstention_text(retrieved, unmentioned)
        ids = self.lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        self.rules.commit(gen, [TokenRecord(int(token)) for token in ids])
        gen.finish("not_covered")
        logger.info("nothing answers this prompt (%s): the answer says so", gen.stats.fallback_reason)

    def _candidates(self, passages: list[Passage], config: NestConfig, stats: GenerationStats) -> Optional[CandidateSet]:
        if self.datastore is None or not passages:
            return None
        encode = EncodeStats()
        indices = [self.datastore.add(p) for p in passages]
        candidates = self.datastore.candidates(indices, stats=encode)
        stats.encode_passes += encode.encode_passes
        stats.encoded_passages += encode.encoded_passages
        stats.encode_s += encode.encode_s
        return candidates


# ------------------------------------------------------------------ prompt checks
def _check_text(text: str, what: str) -> None:
    """Refuse text the tokenizer cannot encode: a lone surrogate is not Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{what} holds a lone surrogate ({text[err.start]!r} at character {err.start}), which is not valid "
            "Unicode; decode the source with errors='replace' or remove it"
        ) from None


def check_prompt(prompt: Any) -> None:
    """Check a prompt: a string, or a non-empty list of ``{"role": str, "content": str}`` messages.

    Raises:
        TypeError: the prompt is neither a string nor a list (e.g. a single message dict or bytes).
        ValueError: no messages; a message that is not a mapping, lacks a non-empty string ``role``
            or a string ``content`` (named by its index); or text with a lone surrogate.
    """
    if isinstance(prompt, str):
        _check_text(prompt, "the prompt")
        return
    if isinstance(prompt, (bytes, bytearray, Mapping)) or not isinstance(prompt, Sequence):
        raise TypeError(
            f"the prompt must be a string or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}"
        )
    if not prompt:
        raise ValueError("the prompt has no messages")
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} must be a {{'role', 'content'}} dict, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {i} needs a non-empty string 'role', got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"message {i} needs a string 'content', got {type(content).__name__}")
        _check_text(role, f"message {i} role")
        _check_text(content, f"message {i} content")
