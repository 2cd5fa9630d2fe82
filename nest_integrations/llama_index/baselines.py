"""The conventional RAG baselines over a LlamaIndex index, fit to compare with NEST.

* :func:`rag_query_engine` -- LlamaIndex's stock query engine
  (``index.as_query_engine``) with :class:`HideMetadataFromLLM`: the retrieved
  nodes' texts reach the LM, their file paths and ids do not.
* :class:`RagChatEngine` -- the same over a conversation: each turn is
  retrieved with the conversation's retrieval query
  (:func:`~nest_integrations.policy.conversation.retrieval_query`: a follow-up such as
  "And how do I remove it?" with the earlier questions, the rule
  :class:`~nest_integrations.llama_index.NestChatEngine` uses), and the LM gets
  the earlier turns followed by LlamaIndex's question-answering prompt filled
  with the retrieved texts. This is LangChain's history-aware retriever pattern,
  with the query made by that rule instead of an LM rewrite, so NEST and RAG
  retrieve the same nodes for a follow-up and differ only in how they answer.

Why hide metadata: readers such as ``SimpleDirectoryReader`` put ``file_path``
(and the project's loaders ``path`` and ids) into node metadata, which LlamaIndex
writes into the LM's prompt as ``file_path: /home/.../os.md`` unless the key is
in the node's ``excluded_llm_metadata_keys``; a small LM then echoes the path
into its answer.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import Field
from llama_index.core.chat_engine.types import AgentChatResponse, StreamingAgentChatResponse
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms import LLM
from llama_index.core.memory import BaseMemory
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT_TMPL
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from .retrieving_chat import RetrievingChatEngine

LLM_METADATA_KEYS = ("title",)
"""The only node metadata the baselines let into the LM's prompt (a title helps tell passages apart)."""


def hide_metadata_from_llm(nodes: Sequence[NodeWithScore], keep: Sequence[str] = LLM_METADATA_KEYS) -> list[NodeWithScore]:
    """Copies of ``nodes`` whose every metadata key but ``keep`` is in ``excluded_llm_metadata_keys``.

    The nodes themselves (and the store's records) are not changed: the metadata stays
    in ``source_nodes`` for the reader, only the LM's view of the node loses it.
    """
    hidden = []
    for hit in nodes:
        excluded = sorted(set(hit.node.excluded_llm_metadata_keys) | {key for key in hit.node.metadata if key not in keep})
        hidden.append(NodeWithScore(node=hit.node.model_copy(update={"excluded_llm_metadata_keys": excluded}), score=hit.score))
    return hidden


class HideMetadataFromLLM(BaseNodePostprocessor):
    """A node postprocessor applying :func:`hide_metadata_from_llm` to the retrieved nodes:
    ``index.as_query_engine(node_postprocessors=[HideMetadataFromLLM()])``."""

    keep: List[str] = Field(default_factory=lambda: list(LLM_METADATA_KEYS), description="Metadata keys the LM may see.")

    @classmethod
    def class_name(cls) -> str:
        return "HideMetadataFromLLM"

    def _postprocess_nodes(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        return hide_metadata_from_llm(nodes, self.keep)


def rag_query_engine(index: BaseIndex, llm: LLM, similarity_top_k: int = 8, **kwargs: Any) -> RetrieverQueryEngine:
    """LlamaIndex's stock RAG query engine over ``index`` whose LM sees node texts and titles
    only (:class:`HideMetadataFromLLM`), e.g. with ``NestLLM(mode="base")`` as ``llm``.

    ``kwargs`` go to ``index.as_query_engine`` (response mode, prompt templates...).
    """
    postprocessors = [*kwargs.pop("node_postprocessors", []), HideMetadataFromLLM()]
    return index.as_query_engine(llm=llm, similarity_top_k=similarity_top_k, node_postprocessors=postprocessors, **kwargs)


def context_prompt(nodes: Sequence[NodeWithScore], question: str) -> str:
    """LlamaIndex's question-answering prompt (``DEFAULT_TEXT_QA_PROMPT_TMPL``) filled with
    the nodes' texts as the LM sees them (:class:`MetadataMode.LLM`) and ``question``."""
    context = "\n\n".join(hit.node.get_content(metadata_mode=MetadataMode.LLM) for hit in nodes)
    return DEFAULT_TEXT_QA_PROMPT_TMPL.format(context_str=context, query_str=question)


class RagChatEngine(RetrievingChatEngine):
    """Conventional RAG over a conversation (see the module docstring).

    Example::

        rag = RagChatEngine.from_index(index, llm=NestLLM(mode="base"))
        rag.chat("Where does quill keep its cache?")
        reply = rag.chat("And how do I override it?")   # retrieved with the first question
        reply.response, reply.source_nodes               # every retrieved node: RAG cites nothing

    Args:
        retriever: first stage, queried with each turn's retrieval query.
        llm: the LM writing the answers (any LlamaIndex LLM; ``NestLLM(mode="base")``
            to compare with NEST on the same model).
        memory: the chat history (default: a ``ChatMemoryBuffer`` sized to the LM's context).
        keep_metadata: node metadata keys the LM may see (:func:`hide_metadata_from_llm`).
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: LLM,
        memory: Optional[BaseMemory] = None,
        keep_metadata: Sequence[str] = LLM_METADATA_KEYS,
    ) -> None:
        super().__init__(retriever, llm, memory)
        self.keep_metadata = tuple(keep_metadata)

    def _messages(self, message: str, nodes: list[NodeWithScore]) -> list[ChatMessage]:
        """The LM's messages: the memory's window, the last one carrying the context."""
        messages = list(self.memory.get())
        messages[-1] = ChatMessage(role=MessageRole.USER, content=context_prompt(hide_metadata_from_llm(nodes, self.keep_metadata), message))
        return messages

    def _answer(self, text: str, nodes: list[NodeWithScore]) -> AgentChatResponse:
        self.memory.put(ChatMessage(role=MessageRole.ASSISTANT, content=text))
        return AgentChatResponse(response=text, source_nodes=nodes)

    def chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> AgentChatResponse:
        """Answer ``message`` in the conversation so far (``chat_history`` replaces it when given)."""
        _, nodes = self.begin_turn(message, chat_history)
        return self._answer(self.llm.chat(self._messages(message, nodes)).message.content or "", nodes)

    async def achat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> AgentChatResponse:
        """Async :meth:`chat` (retrieval in a worker thread)."""
        _, nodes = await asyncio.to_thread(self.begin_turn, message, chat_history)
        return self._answer((await self.llm.achat(self._messages(message, nodes))).message.content or "", nodes)

    def stream_chat(self, message: str, chat_history: Optional[List[ChatMessage]] = None) -> StreamingAgentChatResponse:
        """Not supported: the baseline answers whole turns (use :meth:`chat`).

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("RagChatEngine answers whole turns; use chat()")
