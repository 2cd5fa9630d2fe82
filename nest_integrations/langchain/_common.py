"""Helpers shared by :class:`NestLLM` and :class:`ChatNest`.

:class:`NestModelBase` holds the fields, the lazy LM loading and the call
preparation both model classes share (the first stage through
:mod:`.first_stage`); :func:`report_tokens` and :func:`areport_tokens` drive
their streams (the async one off the event loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.outputs import ChatGenerationChunk, GenerationChunk
from langchain_core.vectorstores import VectorStoreRetriever
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from typing_extensions import Self

from nest_integrations.core.config import NestConfig, fold_config_fields
from nest_integrations.core.standard_params import effective_temperature, to_nest_names
from nest_integrations.index.integration_decoder import integration_decoder
from nest_integrations.index.vector_store_keys import lazy_datastore
from .first_stage import PassageSource, relevance_function, retrieve_passages
from .vectorstores import NestVectorStore

if TYPE_CHECKING:  # pragma: no cover
    from langchain_core.language_models.base import LangSmithParams

    from nest_integrations.decoding.decoder import NestDecoder, PromptLike, StreamChunk
    from nest_integrations.decoding.output import NestOutput
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.store.datastore import TokenDatastore

logger = logging.getLogger(__name__)

ChunkT = TypeVar("ChunkT", GenerationChunk, ChatGenerationChunk)


# --------------------------------------------------------------------------- streaming
def report_tokens(chunks: Iterator[ChunkT], run_manager: Optional[CallbackManagerForLLMRun]) -> Iterator[ChunkT]:
    """Pass ``chunks`` through, telling ``run_manager`` about each new token."""
    for chunk in chunks:
        if run_manager:
            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk


async def areport_tokens(
    chunks: AsyncIterator[ChunkT], run_manager: Optional[AsyncCallbackManagerForLLMRun]
) -> AsyncIterator[ChunkT]:
    """Async :func:`report_tokens`."""
    async for chunk in chunks:
        if run_manager:
            await run_manager.on_llm_new_token(chunk.text, chunk=chunk)  # type: ignore[union-attr]
        yield chunk


def all_at_once(config: Any, count: int) -> Any:
    """``config`` of a LangChain ``batch`` with ``max_concurrency`` defaulting to
    ``count``: every input in flight at once, so they decode in one shared batch
    (LangChain's own default is a thread pool of ``cpu_count + 4``)."""
    if isinstance(config, list):
        return [all_at_once(c, count) for c in config]
    config = dict(config or {})
    config.setdefault("max_concurrency", max(count, 1))
    return config


# --------------------------------------------------------------------------- models
class NestModelBase(BaseModel):
    """Fields and behaviour shared by :class:`NestLLM` and :class:`ChatNest`.

    Configuration design: every NEST hyperparameter lives in one validated
    :class:`~nest_integrations.core.config.NestConfig` (``nest_config``). For
    convenience any ``NestConfig`` field may also be given by name, both to the
    constructor (``NestLLM(mode="rag", max_new_tokens=64)`` folds them into
    ``nest_config``) and per call (``llm.invoke(prompt, gamma=1e-3)`` or
    ``llm.bind(mode="base")``). There is a single source of truth and no
    duplicated defaults; unknown names raise a ``ValueError``. LangChain's
    standard ``max_tokens`` is ``max_new_tokens``; ``temperature`` only matters
    with ``do_sample=True`` (0, the standard tests' value, is greedy).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = Field(
        default="default",
        description="LM to load on first use: 'default' (the embedded SmolLM2-135M-Instruct), a Hugging Face "
        "hub id available offline, or a local folder. Ignored when built with from_lm / from_decoder / from_index.",
    )
    device: Optional[str] = Field(default=None, description="Device for the LM ('cpu', 'cuda', 'mps'); default CUDA when available.")
    dtype: Optional[str] = Field(default=None, description="'float32', 'float16' or 'bfloat16'; default float32 on CPU, float16 on GPU.")
    nest_config: NestConfig = Field(
        default_factory=NestConfig,
        description="NEST decoding hyperparameters (mode, passage_k, alpha, gamma, max_new_tokens, ...). "
        "Any NestConfig field may also be passed by name to the constructor or per call.",
    )
    retriever: Optional[PassageSource] = Field(
        default=None,
        description="First stage: a NestVectorStore or any LangChain BaseRetriever / VectorStore. Retrieved documents "
        "become passages whose tokens enter the datastore lazily. None: the LM alone (with a warning).",
    )
    key_layer: str = Field(
        default="ffn_input",
        description="Hidden layer read as datastore keys for retrievers other than a NestVectorStore "
        "('ffn_input' or 'layer:<i>').",
    )

    _lm: Optional["LoadedLM"] = PrivateAttr(default=None)
    _decoder: Optional["NestDecoder"] = PrivateAttr(default=None)
    _datastore: Optional["TokenDatastore"] = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @model_validator(mode="before")
    @classmethod
    def _fold_config_fields(cls, values: Any) -> Any:
        """Move NestConfig field names (and ``max_tokens``) given to the constructor into ``nest_config``."""
        return fold_config_fields(to_nest_names(values) if isinstance(values, dict) else values, "nest_config")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_lm(cls, lm: "LoadedLM", **kwargs: Any) -> Self:
        """Wrap an already loaded LM (``kwargs``: any field, e.g. ``retriever=``, or NestConfig knob)."""
        instance = cls(model=lm.name, **kwargs)
        instance._lm = lm
        return instance

    @classmethod
    def from_decoder(cls, decoder: "NestDecoder", **kwargs: Any) -> Self:
        """Wrap an existing :class:`NestDecoder`, its datastore and its own retriever.

        Without a ``retriever=`` here the decoder retrieves with its own first
        stage (e.g. a :class:`NestIndex`'s hybrid retriever); with one, the
        retrieved documents enter the decoder's datastore.

        Raises:
            ValueError: a LangChain retriever is given but the decoder has no datastore.
        """
        kwargs.setdefault("nest_config", decoder.config)
        instance = cls(model=decoder.lm.name, **kwargs)
        if instance.retriever is not None and decoder.datastore is None:
            raise ValueError("the decoder has no token datastore, so retrieved documents have nowhere to go")
        instance._lm = decoder.lm
        instance._decoder = decoder
        return instance

    @classmethod
    def from_index(cls, path: str, lm: Optional["LoadedLM"] = None, **kwargs: Any) -> Self:
        """Load a saved :class:`~nest_integrations.index.nest_index.NestIndex` folder and decode over it."""
        from nest_integrations.index.nest_index import NestIndex

        return cls.from_decoder(NestIndex.load(path, lm).decoder(), **kwargs)

    # ------------------------------------------------------------------ LM and datastore
    @property
    def lm(self) -> "LoadedLM":
        """The LM, loaded from ``model`` on first use."""
        with self._lock:
            if self._lm is None:
                from nest_integrations.model.lm import load_lm

                logger.info("Loading LM %r", self.model)
                self._lm = load_lm(self.model, device=self.device, dtype=self.dtype)
            return self._lm

    def _decoder_for_call(self) -> "NestDecoder":
        """The user's decoder, or a fresh one over the current datastore (construction is cheap)."""
        if self._decoder is not None:
            return self._decoder
        from nest_integrations.decoding.decoder import NestDecoder

        lm = self.lm
        if self.retriever is None:
            return NestDecoder(lm, None, None, self.nest_config)
        relevance = relevance_function(self.retriever)
        return integration_decoder(
            lm, self.nest_config, retriever=None, relevance=relevance, store=self._nest_store(),
            calibrate=lambda store, lm: store.calibration(lm), own_datastore=self._token_datastore,
        )

    def _nest_store(self) -> Optional[NestVectorStore]:
        """The :class:`NestVectorStore` the retriever searches, if it is one (directly or as its retriever)."""
        store = self.retriever.vectorstore if isinstance(self.retriever, VectorStoreRetriever) else self.retriever
        return store if isinstance(store, NestVectorStore) else None

    def _token_datastore(self, lm: "LoadedLM") -> "TokenDatastore":
        """The model's own datastore, for a retriever other than a :class:`NestVectorStore`."""
        with self._lock:
            if self._datastore is None:
                self._datastore = lazy_datastore(lm, key_layer=self.key_layer)
            return self._datastore

    # ------------------------------------------------------------------ calls
    def _call_config(self, stop: Optional[list[str]], overrides: dict[str, Any]) -> NestConfig:
        overrides = to_nest_names(overrides)
        if stop is not None:
            overrides = {**overrides, "stop": list(stop)}
        try:
            return self.nest_config.updated(**overrides)
        except ValidationError as err:
            raise ValueError(
                f"invalid NEST call options {sorted(overrides)}: {err}. Per-call keyword arguments must be "
                "'query' or NestConfig fields."
            ) from err

    def _nest_call(self, default_query: str, stop: Optional[list[str]], kwargs: dict[str, Any]) -> tuple["NestDecoder", dict[str, Any]]:
        """The decoder and the keyword arguments of one call: retrieval (when a
        LangChain retriever is set) done, the per-call options resolved.

        ``kwargs`` are the per-call options: ``query`` (the retrieval query,
        default ``default_query``) and any NestConfig field.
        """
        overrides = dict(kwargs)
        overrides.pop("stream", None)  # LangChain's streaming switch, already acted upon by the caller
        query = overrides.pop("query", None)
        query = default_query if query is None else str(query)
        config = self._call_config(stop, overrides)
        decoder = self._decoder_for_call()
        passages = None
        if self.retriever is not None and config.mode != "base":
            passages = retrieve_passages(self.retriever, query, config.passage_k)
            logger.debug("retrieved %d passages for %r", len(passages), query)
        return decoder, {"query": query, "passages": passages, **config.model_dump()}

    def _nest_stream(
        self,
        prompt: "PromptLike",
        default_query: str,
        stop: Optional[list[str]],
        kwargs: dict[str, Any],
    ) -> Iterator["StreamChunk"]:
        """Retrieve and stream one generation (see :meth:`_nest_call`). A generator:
        nothing runs before the first ``next``."""
        decoder, call = self._nest_call(default_query, stop, kwargs)
        yield from decoder.stream(prompt, **call)

    def _nest_submit(
        self,
        prompt: "PromptLike",
        default_query: str,
        stop: Optional[list[str]],
        kwargs: dict[str, Any],
    ) -> "Future[NestOutput]":
        """Retrieve here and queue one generation in the LM's shared batch (models
        that cannot share one generate it now); the future resolves to its output."""
        decoder, call = self._nest_call(default_query, stop, kwargs)
        return decoder.submit(prompt, **call)

    async def _anest_generate(
        self,
        prompt: "PromptLike",
        default_query: str,
        stop: Optional[list[str]],
        kwargs: dict[str, Any],
    ) -> "NestOutput":
        """One generation for asyncio: retrieval in a worker thread, decoding in the
        LM's shared batch with the other callers, no thread waiting for it."""
        decoder, call = await asyncio.to_thread(self._nest_call, default_query, stop, kwargs)
        return await decoder.agenerate(prompt, **call)

    async def _anest_stream(
        self,
        prompt: "PromptLike",
        default_query: str,
        stop: Optional[list[str]],
        kwargs: dict[str, Any],
    ) -> AsyncIterator["StreamChunk"]:
        """:meth:`_anest_generate`, streamed."""
        decoder, call = await asyncio.to_thread(self._nest_call, default_query, stop, kwargs)
        async for piece in decoder.astream(prompt, **call):
            yield piece

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        """Not supported: NEST has no JSON mode or tool calling to steer its output into a schema.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not support structured output: NEST copies text from retrieved passages "
            "and has no JSON mode or tool calling. Parse its text yourself, or use another model for that step."
        )

    # ------------------------------------------------------------------ LangChain metadata
    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "retriever": type(self.retriever).__name__ if self.retriever is not None else None,
            **self.nest_config.model_dump(),
            "temperature": effective_temperature(self.nest_config),
        }

    def _get_ls_params(self, stop: Optional[list[str]] = None, **kwargs: Any) -> "LangSmithParams":
        """Tracing parameters with the values this call decodes with (per-call options applied)."""
        params = super()._get_ls_params(stop=stop, **kwargs)  # type: ignore[misc]
        knobs = {key: value for key, value in to_nest_names(kwargs).items() if key in NestConfig.model_fields}
        config = self._call_config(stop, knobs)
        params["ls_provider"] = "nest"
        params["ls_model_name"] = str(kwargs.get("model") or self.model)
        params["ls_max_tokens"] = config.max_new_tokens
        params["ls_temperature"] = effective_temperature(config)
        if config.stop:
            params["ls_stop"] = list(config.stop)
        return params
