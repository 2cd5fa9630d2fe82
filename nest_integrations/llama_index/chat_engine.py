"""NestChatEngine: a LlamaIndex chat engine whose answers and history keep NEST's citations.

LlamaIndex's stock chat engines rebuild the assistant message from its text,
so the ``CitationBlock``\\ s of a :class:`NestLLM` answer are lost, and their
``source_nodes`` are every retrieved node. This engine retrieves for each turn,
answers with NEST over the retrieved nodes and keeps:

* in the response: ``source_nodes`` = the nodes copied from (as
  :class:`NestQueryEngine`), ``metadata["citations"]`` and ``metadata["nest"]``;
* in the history: the assistant message with one ``CitationBlock`` per copied span.

Each turn's retrieval query is the conversation's
(:class:`~nest_integrations.llama_index.retrieving_chat.RetrievingChatEngine`): the last
user message, preceded by the earlier user turns when it is a follow-up ("And how do
I send a value into it?").
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Literal, Optional

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine.types import AgentChatResponse, StreamingAgentChatResponse
from llama_index.core.memory import BaseMemory

from nest_integrations.decoding.output import NestOutput
from .llms import NestLLM, assistant_message
from .query_engine import cited_nodes, response_metadata
from .retrieving_chat import RetrievingChatEngine


class NestChatEngine(RetrievingChatEngine):
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
        super().__init__(retriever, llm, memory)
        self.mode = mode

    def _answer(self, output: NestOutput, nodes: Any) -> AgentChatResponse:
        self.memory.put(assistant_message(output.text, output.spans))
        return AgentChatResponse(
            response=output.text, source_nodes=cited_nodes(output, nodes), metadata=response_metadata(output, nodes)
        )

    def chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> AgentChatResponse:
        """Answer ``message`` in the conversation so far (``chat_history`` replaces it when given)."""
        query, nodes = self.begin_turn(message, chat_history)
        return self._answer(self.llm.generate(self.memory.get(), nodes=nodes, query=query, mode=self.mode), nodes)

    async def achat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> AgentChatResponse:
        """Async :meth:`chat`: retrieval runs in a worker thread, decoding in the LM's
        shared batch; a cancelled task takes its row out of the batch and adds no reply
        to the memory."""
        query, nodes = await asyncio.to_thread(self.begin_turn, message, chat_history)
        return self._answer(await self.llm.agenerate(self.memory.get(), nodes=nodes, query=query, mode=self.mode), nodes)

    def stream_chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> StreamingAgentChatResponse:
        """Not supported yet: LlamaIndex's streamed chat responses rewrite the history message as plain text.

        Raises:
            NotImplementedError: always; use :meth:`chat`, or ``NestLLM.stream_chat`` for streamed citations.
        """
        raise NotImplementedError(
            "NestChatEngine does not stream yet (LlamaIndex's streamed chat responses drop citations from the "
            "history); use chat(), or NestLLM.stream_chat for streamed text with citations"
        )
