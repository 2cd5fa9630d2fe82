"""ChatNest: NEST as a LangChain chat model, with copied spans cited as standard citations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ChatMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.content import Citation, TextContentBlock, create_citation
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from nest_integrations.decoding.output import Span
from nest_integrations.decoding.rendering import DocumentNumbers
from nest_integrations.decoding.spans import merge_spans
from nest_integrations.policy.conversation import retrieval_query
from ._common import NestModelBase, all_at_once, areport_tokens, report_tokens

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.decoding.decoder import StreamChunk
    from nest_integrations.decoding.output import NestOutput

_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


class ChatNest(NestModelBase, BaseChatModel):
    """Nearest Neighbor Speculative Decoding as a LangChain chat model.

    Messages go through the LM's chat template. Passages come from
    ``retriever`` (a :class:`~nest_integrations.langchain.NestVectorStore` or any
    LangChain ``BaseRetriever`` / ``VectorStore``), queried with the
    conversation's retrieval query unless a ``query=`` is passed per call: the
    last human message, with the earlier human turns before it when it is a
    follow-up ("And how do I send a value into it?"; see
    :func:`nest_integrations.policy.conversation.retrieval_query`). Fields and
    per-call options are those of :class:`~nest_integrations.langchain.NestLLM`.

    Instantiate:
        From a loaded LM and a store (or ``ChatNest(model="default", retriever=store)``)::

            from nest_integrations.langchain import ChatNest

            chat = ChatNest.from_lm(lm, retriever=store, max_new_tokens=64)

    Invoke:
        The answer's text block carries one citation per copied span::

            message = chat.invoke("Who was Marie Curie?")
            message.content_blocks
            # [{"type": "text", "text": "...",
            #   "annotations": [{"type": "citation", "title": "Marie Curie",
            #                    "cited_text": "...", "start_index": 0, "end_index": 42,
            #                    "extras": {"source_number": 1, "document": "docs/curie.md",
            #                               "doc_char_start": 120, "doc_char_end": 162,
            #                               "line_start": 3, "line_end": 3,
            #                               "source_id": "curie#1", "metadata": {...},
            #                               "chunk_char_start": 5, "chunk_char_end": 47, ...}}]}]
            message.response_metadata["attribution_ratio"]

    Output:
        The ``AIMessage`` content is one text block. Each copied span is a
        citation whose ``start_index``/``end_index`` delimit it in the block text,
        ``cited_text`` is the verbatim passage text, and ``extras`` hold where
        it sits in its document (:class:`~nest_integrations.decoding.output.SourceLocation`):
        ``document`` (the file path or ``source`` / ``file_name`` / ``doc_id``
        metadata), ``doc_char_start`` / ``doc_char_end`` and ``line_start`` /
        ``line_end`` (1-based, inclusive; None when the document text is
        unknown), and ``source_number``, the document's number in order of first
        use (the ``[n]`` of :data:`~nest_integrations.langchain.cite`); then the
        chunk: ``source_id``, its ``metadata`` and the span's offsets in the
        chunk's text (``chunk_char_start`` / ``chunk_char_end``; not offsets in
        the file).
        ``response_metadata`` holds the full output contract
        (``NestOutput.to_dict()``) and ``usage_metadata`` the token counts.

    Stream:
        Chunks carry their text as it is accepted; a span's citation arrives
        with the chunk that completes it, so summing the chunks gives the same
        text, citations and ``response_metadata`` as ``invoke``.

    Concurrency:
        Concurrent calls (threads, ``ainvoke`` tasks, ``batch`` / ``abatch``,
        whose inputs are all in flight at once unless ``max_concurrency`` is
        set) decode together in shared forward passes of the LM
        (:mod:`nest_integrations.decoding.batching_service`), each with the output it gets alone.

    Tool calling and structured output are not supported: ``bind_tools`` and
    ``with_structured_output`` raise ``NotImplementedError``.
    """

    @property
    def _llm_type(self) -> str:
        return "nest-chat"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Optional[str] = None, **kwargs: Any) -> Any:
        """Not supported: NEST generates text and cannot emit tool calls.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            "ChatNest does not support tool calling: NEST generates (and copies) text, it cannot emit tool calls. "
            "Use a tool-calling model for that step and ChatNest for the attributed answer."
        )

    def batch(self, inputs: list[Any], config: Any = None, *, return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """LangChain's ``batch`` with every input in flight at once (unless
        ``max_concurrency`` is set), so they decode in one shared batch."""
        return super().batch(inputs, all_at_once(config, len(inputs)), return_exceptions=return_exceptions, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, query = _to_prompt(messages)
        return self._result(self._nest_submit(prompt, query, stop, kwargs).result())

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt, query = _to_prompt(messages)
        return self._result(await self._anest_generate(prompt, query, stop, kwargs))

    def _result(self, output: "NestOutput") -> ChatResult:
        numbers = DocumentNumbers()
        block = _text_block(output.text, [_citation(span, numbers) for span in output.spans if span.copied])
        message = AIMessage(
            content=[block],  # type: ignore[list-item]
            response_metadata=self._response_metadata(output),
            usage_metadata=_usage(output),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _chunk(self, piece: "StreamChunk", citations: "_CitationStream") -> ChatGenerationChunk:
        block = _text_block(piece.text, citations.feed(piece))
        block["index"] = 0  # type: ignore[typeddict-unknown-key]  # chunks merge into one block
        if piece.output is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=[block]))  # type: ignore[list-item]
        message = AIMessageChunk(
            content=[block],  # type: ignore[list-item]
            response_metadata=self._response_metadata(piece.output),
            usage_metadata=_usage(piece.output),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        prompt, query = _to_prompt(messages)
        citations = _CitationStream()
        chunks = (self._chunk(piece, citations) for piece in self._nest_stream(prompt, query, stop, kwargs))
        yield from report_tokens(chunks, run_manager)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        prompt, query = _to_prompt(messages)
        citations = _CitationStream()
        chunks = (self._chunk(piece, citations) async for piece in self._anest_stream(prompt, query, stop, kwargs))
        async for chunk in areport_tokens(chunks, run_manager):
            yield chunk

    def _response_metadata(self, output: "NestOutput") -> dict[str, Any]:
        return {
            **output.to_dict(),
            "finish_reason": output.stats.finish_reason,
            "fallback_reason": output.stats.fallback_reason,
            "model_name": self.model,
            "model_provider": "nest",
        }


def _to_prompt(messages: list[BaseMessage]) -> tuple[list[dict[str, str]], str]:
    """Role/content dicts for the chat template, and the default retrieval query
    (:func:`~nest_integrations.policy.conversation.retrieval_query`: the last human
    message, preceded by the earlier human turns when it is a follow-up; the last
    message when there is no human one).

    Raises:
        ValueError: a message kind the chat template cannot take (tool messages).
    """
    prompt = []
    for message in messages:
        if isinstance(message, ChatMessage):
            role = message.role
        elif message.type in _ROLES:
            role = _ROLES[message.type]
        else:
            raise ValueError(f"ChatNest takes system, human, AI and chat messages, not {message.type!r} messages")
        prompt.append({"role": role, "content": str(message.text)})
    if not prompt:
        raise ValueError("ChatNest needs at least one message")
    return prompt, retrieval_query(prompt) or prompt[-1]["content"]


def _text_block(text: str, citations: list[Citation]) -> TextContentBlock:
    block = TextContentBlock(type="text", text=text)
    if citations:
        block["annotations"] = list(citations)
    return block


def _citation(span: Span, numbers: DocumentNumbers) -> Citation:
    """A LangChain citation for a copied span (offsets into the response text; ``extras``: see
    :class:`ChatNest`), its document numbered by ``numbers``."""
    assert span.source is not None, "copied spans have a source"
    source = span.source
    location = source.location
    return create_citation(
        id=f"nest-{span.start}-{span.end}",
        title=source.title or location.document,
        cited_text=span.text,
        start_index=span.start,
        end_index=span.end,
        source_number=numbers.number(location),
        document=location.document,
        doc_char_start=location.char_start,
        doc_char_end=location.char_end,
        line_start=location.line_start,
        line_end=location.line_end,
        source_id=source.id,
        metadata=source.metadata,
        chunk_char_start=source.chunk_char_start,
        chunk_char_end=source.chunk_char_end,
    )


def _usage(output: "NestOutput") -> UsageMetadata:
    stats = output.stats
    return UsageMetadata(
        input_tokens=stats.prompt_tokens,
        output_tokens=stats.new_tokens,
        total_tokens=stats.prompt_tokens + stats.new_tokens,
    )


class _CitationStream:
    """Citations of whole spans from streamed span pieces.

    A copied span may continue in the next chunk, so the last span seen stays
    open until a piece that cannot join it arrives (or the stream ends); each
    span is cited once, whole, exactly as in the non-streamed output.
    """

    def __init__(self) -> None:
        self._open: Optional[Span] = None
        self._numbers = DocumentNumbers()

    def feed(self, piece: "StreamChunk") -> list[Citation]:
        spans = merge_spans(([self._open] if self._open is not None else []) + list(piece.spans))
        self._open = spans.pop() if spans and piece.output is None else None
        return [_citation(span, self._numbers) for span in spans if span.copied]
