"""The NEST decoder: the entry points of generation over the modes base, rag, knnlm, nest and ra_nest.

:class:`NestDecoder` is a facade. Its entry points (:meth:`~NestDecoder.generate`,
:meth:`~NestDecoder.submit`, :meth:`~NestDecoder.agenerate`,
:meth:`~NestDecoder.generate_batch`, :meth:`~NestDecoder.stream`,
:meth:`~NestDecoder.astream`, :meth:`~NestDecoder.score`) check the prompt
(:mod:`~nest_integrations.decoding.prompts`) and prepare each generation in the caller's thread
(:meth:`~NestDecoder.prepare_row`: retrieval, gate, candidates and copy plan by the
:class:`~nest_integrations.decoding.prepare.Preparer`, then the prompt the LM reads and its
token ids, cut to fit the context).

What happens at each step is the decoder's
:class:`~nest_integrations.decoding.speculation.Speculation`: the mixture p_M
(:mod:`~nest_integrations.decoding.mixing`), proposing a copied span
(:mod:`~nest_integrations.decoding.proposer`), verifying it, committing and the stop rules
(:mod:`~nest_integrations.decoding.verifier`), which the row scheduler applies. Teacher-forced
scoring is :mod:`~nest_integrations.decoding.scoring`.

Every entry point hands its prepared rows to one service, chosen once per decoder (``_service``):
the LM's shared batch (:mod:`~nest_integrations.decoding.batching_service`: each row verifies its
own draft and advances by its own accepted length), or for models with sliding-window attention a
:class:`~nest_integrations.decoding.batching_service.OneByOneService`. One step loop serves both.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch

from nest_integrations.core.config import DEFAULT_ALPHA, DEFAULT_TAU, MODES, NestConfig
from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.passages import Passage
from nest_integrations.model.key_reader import KeyReader
from nest_integrations.model.lm import cache_argument
from nest_integrations.policy.mentions import CorpusTerms
from nest_integrations.store.datastore import TokenDatastore
from .batching import Row, SharedLM, supports_batching
from .batching_service import BatchingService, OneByOneService, shared_service
from .generation import Generation, StreamChunk
from .mixing import Mixer
from .output import GenerationStats, NestOutput
from .prepare import Preparer, ScoredPassages
from .prompts import MIN_PROMPT_TOKENS, PromptLike, check_prompt, check_prompts, check_text, encode_prompt, eos_token_ids, format_prompt, with_transcript_stop
from .proposer import SpanProposer, line_break_id, paragraph_break_id
from .scoring import TeacherForced, TeacherForcedScorer
from .speculation import Speculation
from .verifier import SpanVerifier

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.policy.calibration import Calibration
    from nest_integrations.retrieval.base import PassageRetriever

__all__ = ["NestDecoder", "PromptLike", "ScoredPassages", "StreamChunk", "TeacherForced", "check_prompt"]


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

    MIN_PROMPT_TOKENS = MIN_PROMPT_TOKENS
    """The fewest prompt tokens a cut keeps (:data:`~nest_integrations.decoding.prompts.MIN_PROMPT_TOKENS`)."""

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
        self.config = config or NestConfig()
        self.calibration = calibration
        """alpha/tau fitted for this LM on the corpus (:mod:`~nest_integrations.policy.calibration`), used where
        the config leaves them None; None: :data:`~nest_integrations.core.config.DEFAULT_ALPHA` / ``DEFAULT_TAU``."""
        self._calibrator = calibrator
        self._calibration_lock = threading.Lock()
        if datastore is not None and datastore.encoder.lm is not lm:
            if datastore.encoder.lm.fingerprint() != lm.fingerprint():
                raise ValueError("the datastore was built with another LM than the decoder's")
        key_layer = datastore.encoder.key_layer if datastore is not None else "ffn_input"
        self.reader = KeyReader(lm.model, key_layer)
        self.cache_arg = cache_argument(lm.model)
        """The keyword under which the model's forward takes its KV cache (:func:`~nest_integrations.model.lm.cache_argument`)."""
        self.eos_ids = eos_token_ids(lm)
        """Token ids that end a generation: the tokenizer's EOS and the model's ``generation_config`` ones."""
        self.shared_lm = SharedLM(lm, self.reader, self.cache_arg)
        """The LM and key layer this decoder's rows run on, shared with the other decoders of both."""
        self.shares_batches = supports_batching(lm.model)
        """Whether this model's rows share batches (:func:`~nest_integrations.decoding.batching.supports_batching`)."""
        mixer = Mixer(self.rrc_parameters)
        self.verifier = SpanVerifier(lm.tokenizer, datastore, self.eos_ids)
        proposer = SpanProposer(datastore, self.eos_ids, paragraph_break_id(lm.tokenizer), line_break_id(lm.tokenizer))
        self.speculation = Speculation(mixer, proposer, self.verifier, datastore)
        """What each row of this decoder applies at every step: its mixer, proposer and verifier."""
        self.preparer = Preparer(lm.tokenizer, datastore, retriever, relevance, corpus_terms, self.verifier,
                                 lambda config: self.ensure_calibration(config))
        """Retrieval, gate, candidates and copy plan of each generation, before its first step."""
        self.scorer = TeacherForcedScorer(lm, self.reader, self.cache_arg, mixer)
        """Teacher-forced scoring (:meth:`score`)."""

    retriever = property(lambda self: self.preparer.retriever, doc="The first-stage passage retriever, or None.")
    relevance = property(lambda self: self.preparer.relevance, doc="The cosine of texts to a query, or None.")
    corpus_terms = property(lambda self: self.preparer.corpus_terms, doc="The words of the whole corpus, or None.")

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: PromptLike, *, query: Optional[str] = None, passages: Optional[ScoredPassages] = None, **overrides: Any) -> NestOutput:
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
        return self.submit(prompt, query=query, passages=passages, **overrides).result()

    def submit(self, prompt: PromptLike, *, query: Optional[str] = None, passages: Optional[ScoredPassages] = None, **overrides: Any) -> "Future[NestOutput]":
        """Prepare one generation here (retrieval, gate, prompt checks: their errors
        raise now) and queue it to decode with the LM's other callers; the future
        resolves to its :class:`NestOutput`. Models that cannot share a batch
        (:func:`~nest_integrations.decoding.batching.supports_batching`) decode it now."""
        check_prompt(prompt)
        return self._service().submit(self.prepare_row(prompt, query, passages, self._call_config(overrides)))

    async def agenerate(self, prompt: PromptLike, *, query: Optional[str] = None, passages: Optional[ScoredPassages] = None, **overrides: Any) -> NestOutput:
        """:meth:`generate` for asyncio: preparation runs in a worker thread, decoding
        in the LM's shared batch, and no thread waits for the result. Cancelling the
        awaiting task (``task.cancel()``, ``asyncio.wait_for``) takes the row out of
        the batch at its next step; a task cancelled while its row is prepared never
        queues it."""
        check_prompt(prompt)
        row = await asyncio.to_thread(self.prepare_row, prompt, query, passages, self._call_config(overrides))
        return await self._service().aresult(row)

    def generate_batch(self, prompts: Sequence[PromptLike], *, queries: Optional[Sequence[Optional[str]]] = None,
                       max_batch: Optional[int] = None, **overrides: Any) -> list[NestOutput]:
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

        Every prompt is checked (:func:`~nest_integrations.decoding.prompts.check_prompts`) first.

        Raises:
            TypeError: ``prompts`` is a string (or not a list), or a prompt has the wrong type.
            ValueError: a malformed prompt (named by its index), ``queries`` of another length,
                or ``max_batch`` < 1.
        """
        prompts, queries = check_prompts(prompts, queries)
        if max_batch is not None and int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        config, service = self._call_config(overrides), self._service()
        if max_batch is None:
            futures = [service.submit(self.prepare_row(p, q, None, config)) for p, q in zip(prompts, queries)]
            return [future.result() for future in futures]
        return service.run_batch([self.prepare_row(p, q, None, config) for p, q in zip(prompts, queries)], int(max_batch))

    def stream(self, prompt: PromptLike, *, query: Optional[str] = None, passages: Optional[ScoredPassages] = None, **overrides: Any) -> Iterator[StreamChunk]:
        """Yield text chunks with their spans as tokens are accepted.

        Concatenating the chunks' texts gives the output text, and
        :func:`~nest_integrations.decoding.spans.merge_spans` of their spans gives its spans.
        The last chunk carries the complete :class:`NestOutput`. Nothing runs before the
        first ``next``; closing the iterator early stops the generation.
        """
        check_prompt(prompt)
        config = self._call_config(overrides)
        yield from self._service().stream(self.prepare_row(prompt, query, passages, config))

    async def astream(self, prompt: PromptLike, *, query: Optional[str] = None, passages: Optional[ScoredPassages] = None, **overrides: Any) -> AsyncIterator[StreamChunk]:
        """:meth:`stream` for asyncio: preparation runs in a worker thread, the chunks
        arrive from the LM's shared batch without a thread waiting for them."""
        check_prompt(prompt)
        config = self._call_config(overrides)
        row = await asyncio.to_thread(self.prepare_row, prompt, query, passages, config)
        async for chunk in self._service().astream(row):
            yield chunk

    def prepare_row(self, prompt: PromptLike, query: Optional[str], passages: Optional[ScoredPassages], config: NestConfig) -> Row:
        """One generation made ready to decode in a batch: retrieval, gate, candidates,
        copy plan and the prompt's token ids (:class:`~nest_integrations.decoding.batching.Row`).
        The prompt is assumed checked (:func:`check_prompt`)."""
        started = time.perf_counter()
        gen = Generation(config=with_transcript_stop(self.lm.tokenizer, prompt, config))
        context = self.preparer.prepare(gen, prompt, query, passages)
        prompt_ids = self.encode_prompt(self.format_prompt(prompt, config, context), config, gen.stats)
        generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
        return Row(self.speculation, gen, prompt_ids, generator, submitted=started)

    def score(self, prompt: PromptLike, continuation: str, *, query: Optional[str] = None,
              passages: Optional[ScoredPassages] = None, **overrides: Any) -> TeacherForced:
        """Teacher-forced scoring of ``continuation`` after ``prompt`` in one forward.

        Returns, per continuation token, log p_M and log p_LM of the true token, lambda and the
        RRC distance ratio ``d_min / d_max``, with the same retrieval, gate and mixture as
        :meth:`generate` (``mode`` decides the mixture), in bounded memory
        (:class:`~nest_integrations.decoding.scoring.TeacherForcedScorer`). Tokens beyond the
        context are not scored (``token_ids`` says which are).

        Raises:
            TypeError / ValueError: a malformed prompt (:func:`check_prompt`), a
                continuation that is not a string, holds a lone surrogate or is empty.
        """
        check_prompt(prompt)
        if not isinstance(continuation, str):
            raise TypeError(f"continuation must be a string, got {type(continuation).__name__}")
        check_text(continuation, "continuation")
        config = self.config.updated(**overrides) if overrides else self.config
        gen = Generation(config=config)
        context = self.preparer.prepare(gen, prompt, query, passages)
        prompt_ids = self.encode_prompt(self.format_prompt(prompt, config, context), config, gen.stats, strict=False)
        target = self.lm.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        if not target:
            raise ValueError("continuation is empty")
        # Scored tokens are those that fit the context after the prompt (``token_ids`` says which).
        return self.scorer.score(gen, prompt_ids, target[: max(self.lm.context_length - len(prompt_ids), 1)])

    def format_prompt(self, prompt: PromptLike, config: NestConfig, context: Sequence[Passage] = ()) -> str:
        """The prompt text fed to the LM (:func:`~nest_integrations.decoding.prompts.format_prompt`)."""
        return format_prompt(self.lm.tokenizer, prompt, config, context)

    def encode_prompt(self, text: str, config: NestConfig, stats: GenerationStats, *, strict: bool = True) -> list[int]:
        """Token ids of the formatted prompt ``text``, cut so the generation fits the context
        (:func:`~nest_integrations.decoding.prompts.encode_prompt`)."""
        return encode_prompt(self.lm, self.eos_ids, text, config, stats, strict=strict)

    # ------------------------------------------------------------------ calibration
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

    def _call_config(self, overrides: Mapping[str, Any]) -> NestConfig:
        config = self.config.updated(**overrides) if overrides else self.config
        if config.mode not in MODES:  # validated by pydantic; kept for clarity of the error
            raise ValueError(f"unknown mode {config.mode!r}; choose from {MODES}")
        return config

    def _service(self) -> Union[BatchingService, OneByOneService]:
        """Where this decoder's rows decode: the LM's shared batch, or one by one when the model cannot share one."""
        return shared_service(self.shared_lm) if self.shares_batches else OneByOneService(self.shared_lm)
