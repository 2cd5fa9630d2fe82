"""NestLLM: NEST generation as a LlamaIndex LLM.

Every response carries the output contract (docs/api/output.md) in ``additional_kwargs``:

* ``additional_kwargs["nest"]``: the full :class:`~nest_integrations.decoding.output.NestOutput`
  as a dict, on ``complete`` / ``chat`` responses and on the last streamed one;
* ``additional_kwargs["spans"]``: on each streamed response, the spans of its
  ``delta`` (offsets into the full text; merging them with
  :func:`~nest_integrations.decoding.spans.merge_spans` gives the final spans).

Chat messages hold the answer as one ``TextBlock`` followed by one
``CitationBlock`` per copied span (:func:`citation_blocks`): ``source`` is the
document (the ``file_path`` / ``file_name`` / ``source`` / ``doc_id`` metadata,
else the node's document id), ``title`` the node's title (else the document),
``cited_content`` the copied text, and ``additional_location_info`` (integers
only, as LlamaIndex types it) where the text sits: ``source_number`` (the
document's number in order of first use), ``start_char_index`` /
``end_char_index`` in the document and ``start_line`` / ``end_line`` (1-based,
inclusive; left out when unknown, see
:func:`~nest_integrations.decoding.locations.locate`), ``node_start_char_index`` /
``node_end_char_index`` in the node text and ``answer_start_char_index`` /
``answer_end_char_index`` in the answer.

Call keyword arguments: ``query`` (the first-stage query; default the prompt,
or for chat the conversation's retrieval query: the last user message, preceded
by the earlier user turns when it is a follow-up, see
:func:`~nest_integrations.policy.conversation.retrieval_query`), ``nodes``
(``NodeWithScore`` list used instead of the retriever), and any
:class:`~nest_integrations.core.config.NestConfig` field; the standard
``max_tokens`` is ``max_new_tokens`` and ``temperature`` only matters with
``do_sample`` (0 is greedy).

NEST has no tool calling and no JSON mode: ``structured_predict`` and its
variants, ``as_structured_llm`` and ``predict_and_call`` raise
``NotImplementedError``.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, AsyncGenerator, Iterator, Optional, Sequence, Union

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CitationBlock,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr, model_validator
from llama_index.core.indices.base import BaseIndex
from llama_index.core.indices.vector_store.base import VectorStoreIndex
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from nest_integrations.core.config import NestConfig, fold_config_fields
from nest_integrations.core.similarity import embedding_relevance
from nest_integrations.core.standard_params import to_nest_names
from nest_integrations.decoding.output import NestOutput, Span
from nest_integrations.decoding.rendering import DocumentNumbers
from nest_integrations.decoding.spans import merge_spans
from nest_integrations.index.integration_decoder import integration_decoder
from nest_integrations.index.vector_store_keys import lazy_datastore
from nest_integrations.model.lm import DEFAULT_MODEL, LoadedLM, load_lm
from nest_integrations.store.datastore import TokenDatastore
from ._common import default_embed_model, nodes_to_scored_passages
from .first_stage import LlamaIndexPassageRetriever
from .vector_stores import NestVectorStore

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.decoding.decoder import NestDecoder, StreamChunk

logger = logging.getLogger(__name__)

_ROLES = {MessageRole.DEVELOPER: "system", MessageRole.CHATBOT: "assistant", MessageRole.MODEL: "assistant"}

RetrieverSource = Union[BaseRetriever, BaseIndex]


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """LlamaIndex messages as the ``{"role", "content"}`` dicts the chat template takes."""
    return [{"role": _ROLES.get(m.role, m.role.value), "content": m.content or ""} for m in messages]


def citation_blocks(spans: Sequence[Span]) -> list[CitationBlock]:
    """One ``CitationBlock`` per copied span (see the module docstring for its fields)."""
    numbers = DocumentNumbers()
    blocks = []
    for span in spans:
        if not span.copied or span.source is None:
            continue
        location = span.source.location
        where = {
            "source_number": numbers.number(location),
            "start_char_index": location.char_start,
            "end_char_index": location.char_end,
            "start_line": location.line_start,
            "end_line": location.line_end,
            "node_start_char_index": span.source.chunk_char_start,
            "node_end_char_index": span.source.chunk_char_end,
            "answer_start_char_index": span.start,
            "answer_end_char_index": span.end,
        }
        blocks.append(
            CitationBlock(
                cited_content=TextBlock(text=span.text),
                source=location.document,
                title=span.source.title or location.document,
                additional_location_info={key: value for key, value in where.items() if value is not None},
            )
        )
    return blocks


def assistant_message(text: str, spans: Sequence[Span]) -> ChatMessage:
    """The assistant's ``ChatMessage``: ``text``, then one ``CitationBlock`` per copied span
    (:func:`citation_blocks`); what a chat response and a chat engine's memory hold."""
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=[TextBlock(text=text), *citation_blocks(spans)])


def _chunk_kwargs(chunk: StreamChunk) -> dict[str, Any]:
    """``additional_kwargs`` of a streamed response: its delta's spans, and the contract on the last."""
    kwargs: dict[str, Any] = {"spans": [span.model_dump(mode="json") for span in chunk.spans]}
    if chunk.output is not None:
        kwargs["nest"] = chunk.output.to_dict()
    return kwargs


class _SoFar:
    """The text and merged spans of a stream so far, chunk by chunk."""

    def __init__(self) -> None:
        self.text = ""
        self.spans: list[Span] = []

    def add(self, chunk: StreamChunk) -> tuple[str, list[Span], StreamChunk]:
        self.text += chunk.text
        self.spans = self.spans[:-1] + merge_spans([*self.spans[-1:], *chunk.spans])
        return self.text, self.spans, chunk


class NestLLM(CustomLLM):
    """A LlamaIndex LLM that generates with NEST: retrieval-grounded, with span-level attribution.

    Examples:
        Over a :class:`NestVectorStore` index (shares the store's token datastore)
        or any retriever (retrieved nodes enter a datastore of the LLM's own)::

            llm = NestLLM("default", retriever=index)
            llm = NestLLM("Qwen/Qwen2.5-0.5B-Instruct", retriever=index.as_retriever(similarity_top_k=8))
            response = llm.complete("Tell me a bio of Marie Curie.")
            response.additional_kwargs["nest"]["spans"]

    Without a retriever (and without ``nodes=``) it generates with the LM alone,
    and the output says so (``stats.fallback_reason == "no_retriever"``). As the llm of LlamaIndex's own
    engines (``index.as_query_engine(llm=...)``, ``CitationQueryEngine``) use
    ``mode="base"``: their prompts already hold the context. Any NestConfig
    knob is a constructor keyword (or pass ``config=``).

    Args:
        model: ``"default"`` (the embedded SmolLM2-135M-Instruct), a hub id, a
            local folder (loaded on first use), or an already loaded ``LoadedLM``.
        retriever: the passage stage: a LlamaIndex retriever, or an index (its
            ``as_retriever(similarity_top_k=config.passage_k)``).
        embed_model: embeds queries and passages for the relevance gate
            (``config.min_passage_relevance``; -1 turns the gate off). None: the
            embed model of the index given as ``retriever``, else the bundled
            all-MiniLM-L6-v2 (:func:`default_embed_model`, loaded on first use).
        **kwargs: the fields below (``config`` may be a dict) and ``LLM`` fields.
    """

    model: str = Field(
        default=DEFAULT_MODEL,
        description="'default' (the embedded SmolLM2-135M-Instruct), a hub id or a local folder; "
        "the LM's name when a loaded LM is passed.",
    )
    device: Optional[str] = Field(default=None, description="'cpu', 'cuda', 'mps'...; default CUDA when available.")
    dtype: Optional[str] = Field(default=None, description="'float32', 'float16' or 'bfloat16'; default per device.")
    config: NestConfig = Field(default_factory=NestConfig, description="Default NEST decoding configuration.")
    context_window: Optional[int] = Field(
        default=None,
        gt=0,
        description="Context window reported to LlamaIndex's prompt packing; None: the model's context length "
        "(max_position_embeddings). Longer prompts are cut to their last tokens by the decoder.",
    )
    key_layer: str = Field(
        default="ffn_input",
        description="Key layer of the LLM's own token datastore (a NestVectorStore index brings its own).",
    )
    encoding_prefix: Optional[str] = Field(default="auto", description="Passage encoding prefix of that datastore.")
    cache_mb: float = Field(default=1024.0, gt=0, description="Bound of that datastore's key cache in megabytes.")

    @model_validator(mode="before")
    @classmethod
    def _fold_config_fields(cls, values: Any) -> Any:
        """``NestLLM(mode="base", max_tokens=64)``: NestConfig knobs (and ``max_tokens``) as keywords go into
        ``config`` (``system_prompt`` stays LlamaIndex's own field)."""
        values = to_nest_names(values) if isinstance(values, dict) else values
        return fold_config_fields(values, "config", skip=("system_prompt",))

    _lm: Optional[LoadedLM] = PrivateAttr(default=None)
    _retriever: Optional[LlamaIndexPassageRetriever] = PrivateAttr(default=None)
    _store: Optional[NestVectorStore] = PrivateAttr(default=None)
    _datastore: Optional[TokenDatastore] = PrivateAttr(default=None)
    _embed_model: Optional[BaseEmbedding] = PrivateAttr(default=None)
    _lock: threading.RLock = PrivateAttr(default_factory=threading.RLock)

    def __init__(
        self,
        model: Union[str, LoadedLM] = DEFAULT_MODEL,
        *,
        retriever: Optional[RetrieverSource] = None,
        embed_model: Optional[BaseEmbedding] = None,
        **kwargs: Any,
    ) -> None:
        loaded = model if isinstance(model, LoadedLM) else None
        super().__init__(model=loaded.name if loaded is not None else model, **kwargs)
        self._lm = loaded
        self._embed_model = embed_model
        if embed_model is None and isinstance(retriever, VectorStoreIndex):
            self._embed_model = retriever._embed_model  # the index has no public accessor for it
        if isinstance(retriever, VectorStoreIndex):
            store = retriever.vector_store
            self._store = store if isinstance(store, NestVectorStore) else None
            retriever = retriever.as_retriever(similarity_top_k=self.config.passage_k)
        elif isinstance(retriever, BaseIndex):
            retriever = retriever.as_retriever()
        elif retriever is not None and not isinstance(retriever, BaseRetriever):
            raise TypeError(f"retriever must be a LlamaIndex retriever or index, got {type(retriever).__name__}")
        self._retriever = LlamaIndexPassageRetriever(retriever) if retriever is not None else None

    @classmethod
    def class_name(cls) -> str:
        return "NestLLM"

    # ------------------------------------------------------------------ resources
    @property
    def lm(self) -> LoadedLM:
        """The loaded LM (loaded on first access)."""
        with self._lock:
            if self._lm is None:
                logger.info("loading LM %r", self.model)
                self._lm = load_lm(self.model, device=self.device, dtype=self.dtype)
            return self._lm

    @property
    def retriever(self) -> Optional[BaseRetriever]:
        """The LlamaIndex retriever of the passage stage (None: the LM alone)."""
        return self._retriever.retriever if self._retriever is not None else None

    @property
    def metadata(self) -> LLMMetadata:
        """Context window from the model config (or ``context_window``); ``num_output`` is ``config.max_new_tokens``."""
        lm = self.lm
        return LLMMetadata(
            context_window=self.context_window or lm.context_length,
            num_output=self.config.max_new_tokens,
            is_chat_model=True,
            model_name=lm.name,
        )

    def _token_datastore(self, lm: LoadedLM) -> TokenDatastore:
        """The LLM's own datastore, for a retriever other than a :class:`NestVectorStore` index."""
        with self._lock:
            if self._datastore is None:
                self._datastore = lazy_datastore(
                    lm, key_layer=self.key_layer, encoding_prefix=self.encoding_prefix, cache_mb=self.cache_mb
                )
            return self._datastore

    @property
    def embed_model(self) -> BaseEmbedding:
        """The relevance gate's embed model (the bundled MiniLM loaded on first use when none was given)."""
        with self._lock:
            if self._embed_model is None:
                self._embed_model = default_embed_model()
            return self._embed_model

    def _relevance(self, query: str, texts: Sequence[str]) -> list[float]:
        """Cosine similarity of each text to ``query`` under :attr:`embed_model`
        (:func:`~nest_integrations.core.similarity.embedding_relevance`), which is loaded
        when the gate first asks, not when a decoder is built."""
        if not texts:
            return []
        embed_model = self.embed_model
        return embedding_relevance(embed_model.get_query_embedding, embed_model.get_text_embedding_batch)(query, texts)

    def _decoder(self) -> NestDecoder:
        """A decoder over the current datastore and config (cheap: built per call)."""
        return integration_decoder(
            self.lm, self.config, retriever=self._retriever, relevance=self._relevance, store=self._store,
            calibrate=lambda store, lm: store.calibration(lm, self.embed_model), own_datastore=self._token_datastore,
        )

    def _decoder_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Decoder keyword arguments from call kwargs (``nodes`` become ``passages``)."""
        kwargs = to_nest_names(kwargs)
        nodes = kwargs.pop("nodes", None)
        if nodes is not None:
            kwargs["passages"] = nodes_to_scored_passages(nodes)
        return kwargs

    # ------------------------------------------------------------------ NEST entry points
    def generate(self, prompt: Union[str, Sequence[ChatMessage]], **kwargs: Any) -> NestOutput:
        """One attributed generation for a prompt or a message list.

        Args:
            kwargs: ``query``, ``nodes`` and NestConfig overrides (module docstring).
        """
        prompt_like = prompt if isinstance(prompt, str) else message_dicts(prompt)
        return self._decoder().generate(prompt_like, **self._decoder_kwargs(kwargs))

    async def agenerate(self, prompt: Union[str, Sequence[ChatMessage]], **kwargs: Any) -> NestOutput:
        """:meth:`generate` for asyncio: concurrent calls decode together in shared
        forward passes (:mod:`nest_integrations.decoding.batching_service`); the event loop stays free."""
        prompt_like = prompt if isinstance(prompt, str) else message_dicts(prompt)
        return await self._decoder().agenerate(prompt_like, **self._decoder_kwargs(kwargs))

    def _stream(
        self, prompt: Union[str, list[dict[str, str]]], kwargs: dict[str, Any]
    ) -> Iterator[tuple[str, list[Span], StreamChunk]]:
        """Decoder chunks with the text and merged spans accumulated so far."""
        so_far = _SoFar()
        for chunk in self._decoder().stream(prompt, **self._decoder_kwargs(kwargs)):
            yield so_far.add(chunk)

    async def _astream(
        self, prompt: Union[str, list[dict[str, str]]], kwargs: dict[str, Any]
    ) -> AsyncGenerator[tuple[str, list[Span], StreamChunk], None]:
        """:meth:`_stream` for asyncio."""
        so_far = _SoFar()
        async for chunk in self._decoder().astream(prompt, **self._decoder_kwargs(kwargs)):
            yield so_far.add(chunk)

    @staticmethod
    def _completion_kwargs(formatted: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A ``formatted`` prompt is already templated: it is fed to the LM as is."""
        return {"use_chat_template": False, **kwargs} if formatted else kwargs

    @staticmethod
    def _completion(output: NestOutput) -> CompletionResponse:
        return CompletionResponse(text=output.text, additional_kwargs={"nest": output.to_dict()})

    @staticmethod
    def _completion_delta(text: str, spans: list[Span], chunk: StreamChunk) -> CompletionResponse:
        return CompletionResponse(text=text, delta=chunk.text, additional_kwargs=_chunk_kwargs(chunk))

    @staticmethod
    def _chat_response(output: NestOutput) -> ChatResponse:
        return ChatResponse(
            message=assistant_message(output.text, output.spans), additional_kwargs={"nest": output.to_dict()}
        )

    @staticmethod
    def _chat_delta(text: str, spans: list[Span], chunk: StreamChunk) -> ChatResponse:
        return ChatResponse(message=assistant_message(text, spans), delta=chunk.text, additional_kwargs=_chunk_kwargs(chunk))

    def _stream_complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponseGen:
        for so_far in self._stream(prompt, self._completion_kwargs(formatted, kwargs)):
            yield self._completion_delta(*so_far)

    def _stream_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponseGen:
        for so_far in self._stream(message_dicts(messages), kwargs):
            yield self._chat_delta(*so_far)

    async def _astream_complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponseAsyncGen:
        async for so_far in self._astream(prompt, self._completion_kwargs(formatted, kwargs)):
            yield self._completion_delta(*so_far)

    async def _astream_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponseAsyncGen:
        async for so_far in self._astream(message_dicts(messages), kwargs):
            yield self._chat_delta(*so_far)

    # ------------------------------------------------------------------ LLM interface
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Generate for ``prompt`` (wrapped in the chat template unless ``formatted``)."""
        return self._completion(self.generate(prompt, **self._completion_kwargs(formatted, kwargs)))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream a completion; each response's ``additional_kwargs["spans"]`` covers its delta."""
        return self._stream_complete(prompt, formatted, kwargs)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer ``messages`` through the model's chat template, with a ``CitationBlock`` per copied span."""
        return self._chat_response(self.generate(messages, **kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream a chat answer; each message holds the text and the citations so far."""
        return self._stream_chat(messages, kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._completion(await self.agenerate(prompt, **self._completion_kwargs(formatted, kwargs)))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return self._astream_complete(prompt, formatted, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat_response(await self.agenerate(messages, **kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return self._astream_chat(messages, kwargs)

    # ------------------------------------------------------------------ not supported
    def _no_structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "NestLLM does not support structured output or tool calling: NEST copies text from retrieved passages "
            "and has no JSON mode or function calling. Parse its text yourself, or use another LLM for that step."
        )

    structured_predict = _no_structured_output
    stream_structured_predict = _no_structured_output
    as_structured_llm = _no_structured_output
    predict_and_call = _no_structured_output

    async def astructured_predict(self, *args: Any, **kwargs: Any) -> Any:
        return self._no_structured_output()

    async def astream_structured_predict(self, *args: Any, **kwargs: Any) -> Any:
        return self._no_structured_output()

    async def apredict_and_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._no_structured_output()
