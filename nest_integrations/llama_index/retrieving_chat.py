"""RetrievingChatEngine: a chat engine's conversation and its retrieval for each turn.

The two chat engines of this package, NEST's
(:class:`~nest_integrations.llama_index.chat_engine.NestChatEngine`) and the RAG baseline
(:class:`~nest_integrations.llama_index.baselines.RagChatEngine`), keep the conversation in a
LlamaIndex memory and retrieve each turn with the conversation's retrieval query
(:func:`~nest_integrations.policy.conversation.retrieval_query`: a follow-up such as "And how
do I remove it?" with the earlier questions). They differ only in how they answer, so NEST and
RAG retrieve the same nodes for the same conversation.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, TypeVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.types import BaseChatEngine, StreamingAgentChatResponse
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms import LLM
from llama_index.core.memory import BaseMemory, ChatMemoryBuffer
from llama_index.core.schema import NodeWithScore

from nest_integrations.policy.conversation import retrieval_query
from .llms import message_dicts

logger = logging.getLogger(__name__)

__all__ = ["RetrievingChatEngine"]

_Engine = TypeVar("_Engine", bound="RetrievingChatEngine")


class RetrievingChatEngine(BaseChatEngine):
    """The memory and the per-turn retrieval of a chat engine; subclasses answer.

    Args:
        retriever: first stage, queried with each turn's retrieval query.
        llm: the LM writing the answers.
        memory: the chat history (default: a ``ChatMemoryBuffer`` sized to the LM's context).
    """

    def __init__(self, retriever: BaseRetriever, llm: LLM, memory: Optional[BaseMemory] = None) -> None:
        self.retriever = retriever
        self.llm = llm
        self.memory = memory if memory is not None else ChatMemoryBuffer.from_defaults(llm=llm)

    @classmethod
    def from_index(cls: type[_Engine], index: BaseIndex, llm: LLM, similarity_top_k: int = 8, **kwargs: Any) -> _Engine:
        """An engine over ``index.as_retriever(similarity_top_k=...)``; ``kwargs`` go to the constructor."""
        return cls(index.as_retriever(similarity_top_k=similarity_top_k), llm, **kwargs)

    @property
    def chat_history(self) -> List[ChatMessage]:
        return self.memory.get_all()

    def reset(self) -> None:
        self.memory.reset()

    def begin_turn(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> tuple[str, list[NodeWithScore]]:
        """Set the history (a copy of ``chat_history`` when given: the memory appends to the list
        it holds, not to the caller's), add the user ``message`` and retrieve; returns the
        retrieval query and the nodes.

        The query is built from the whole history (``get_all``), not the window the memory hands
        the LM, so a follow-up still finds its topic.
        """
        if chat_history is not None:
            self.memory.set(list(chat_history))
        self.memory.put(ChatMessage(role=MessageRole.USER, content=message))
        query = retrieval_query(message_dicts(self.memory.get_all())) or message
        nodes = self.retriever.retrieve(query)
        logger.debug("retrieval query %r: %d node(s)", query, len(nodes))
        return query, nodes

    async def astream_chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> StreamingAgentChatResponse:
        return self.stream_chat(message, chat_history)
