"""NestChatEngine: a LlamaIndex chat engine whose answers and history keep NEST's citations.

LlamaIndex's stock chat engines rebuild the assistant message from its text,
so the ``CitationBlock``\\ s of a :class:`NestLLM` answer are lost, and their
``source_nodes`` are every retrieved node. This engine retrieves for each turn,
answers with NEST over the retrieved nodes and keeps:

* in the response: ``source_nodes`` = the nodes copied from (as
  :class:`NestQueryEngine`), ``metadata["citations"]`` and ``metadata["nest"]``;
* in the history: the assistant message with one ``CitationBlock`` per copied span.

Each turn's retrieval query is the conversation's
(:func:`~nest_integrations.policy.conversation.retrieval_query`): the last user
message, preceded by the earlier user turns when it is a follow-up ("And how do
I send a value into it?").
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, List, Literal, Optional

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.types import AgentChatResponse, BaseChatEngine, StreamingAgentChatResponse
from llama_index.core.indices.base import BaseIndex
from llama_index.core.memory import BaseMemory, ChatMemoryBuffer

from nest_integrations.decoding.output import NestOutput
from nest_integrations.policy.conversation import retrieval_query
from .llms import NestLLM, assistant_message, message_dicts
from .query_engine import cited_nodes, response_metadata

logger = logging.getLogger(__name__)


class NestChatEngine(BaseChatEngine):
    """Multi-turn question answering with NEST; citations survive in responses and history.

    Example::

        engine = NestChatEngine.from_index(index, llm=NestLLM("default"))
        response = engine.chat("Who was Marie Curie?")
        response.source_nodes, response.metadata["citations"]
        engine.chat_history[-1].blocks   # TextBlock, then a CitationBlock per copied span

    Args:
        retriever: first stage; its nodes form each turn's token datastore.
        llm: the NEST generator.
        memory: the chat history (default: a ``ChatMemoryBuffer`` sized to the LM's context).
        mode: ``"nest"`` or ``"ra_nest"`` (the top nodes also in the prompt).
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: NestLLM,
        memory: Optional[BaseMemory] = None,
        mode: Literal["nest", "ra_nest"] = "nest",
    ) -> None:
        self.retriever = retriever
        self.llm = llm
        self.mode = mode
        self._memory = memory if memory is not None else ChatMemoryBuffer.from_defaults(llm=llm)

    @classmethod
    def from_index(cls, index: BaseIndex, llm: NestLLM, similarity_top_k: int = 8, **kwargs: Any) -> NestChatEngine:
        """An engine over ``index.as_retriever(similarity_top_k=...)``."""
        return cls(index.as_retriever(similarity_top_k=similarity_top_k), llm, **kwargs)

    @property
    def chat_history(self) -> List[ChatMessage]:
        return self._memory.get_all()

    def reset(self) -> None:
        self._memory.reset()

    def _turn(self, message: str, chat_history: Optional[List[ChatMessage]]) -> tuple[list[ChatMessage], Any, str]:
        """Set the history, add the user message, retrieve; returns the messages, the nodes and the query.

        The query is built from the whole history (``get_all``), not the window
        the memory hands the LM, so a follow-up still finds its topic.
        """
        if chat_history is not None:
            self._memory.set(chat_history)
        self._memory.put(ChatMessage(role=MessageRole.USER, content=message))
        query = retrieval_query(message_dicts(self._memory.get_all())) or message
        return self._memory.get(), self.retriever.retrieve(query), query

    def _answer(self, output: NestOutput, nodes: Any) -> AgentChatResponse:
        self._memory.put(assistant_message(output.text, output.spans))
        return AgentChatResponse(
            response=output.text, source_nodes=cited_nodes(output, nodes), metadata=response_metadata(output, nodes)
        )

    def chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> AgentChatResponse:
        """Answer ``message`` in the conversation so far (``chat_history`` replaces it when given)."""
        messages, nodes, query = self._turn(message, chat_history)
        return self._answer(self.llm.generate(messages, nodes=nodes, query=query, mode=self.mode), nodes)

    async def achat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> AgentChatResponse:
        """Async :meth:`chat`: retrieval runs in a worker thread, decoding in the LM's
        shared batch; a cancelled task takes its row out of the batch and adds no reply
        to the memory."""
        messages, nodes, query = await asyncio.to_thread(self._turn, message, chat_history)
        return self._answer(await self.llm.agenerate(messages, nodes=nodes, query=query, mode=self.mode), nodes)

    def stream_chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> StreamingAgentChatResponse:
        """Not supported yet: LlamaIndex's streamed chat responses rewrite the history message as plain text.

        Raises:
            NotImplementedError: always; use :meth:`chat`, or ``NestLLM.stream_chat`` for streamed citations.
        """
        raise NotImplementedError(
            "NestChatEngine does not stream yet (LlamaIndex's streamed chat responses drop citations from the "
            "history); use chat(), or NestLLM.stream_chat for streamed text with citations"
        )

    async def astream_chat(
        self, message: str, chat_history: Optional[List[ChatMessage]] = None
    ) -> StreamingAgentChatResponse:
        return self.stream_chat(message, chat_history)

