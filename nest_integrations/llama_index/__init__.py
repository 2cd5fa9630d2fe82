"""LlamaIndex integration: NEST as an LLM, a vector store and a query engine.

* :class:`NestLLM`: a LlamaIndex LLM generating with NEST over any retriever
  or index, with the output contract in every response's ``additional_kwargs``
  and ``CitationBlock``\\ s for copied spans in chat messages.
* :class:`NestVectorStore`: an in-memory vector store that keeps NEST's token
  datastore in sync with its nodes, persisted without pickle.
* :class:`NestQueryEngine`: retrieve, generate, and return exactly the cited
  nodes with span-level citations (streamed too).
* :class:`NestChatEngine`: the same over a conversation, with citations kept
  in the chat history.
* :class:`MarkdownSectionNodeParser`: a node parser cutting Markdown along its
  sections, with exact ``start_char_idx``.
* :func:`rag_query_engine` and :class:`RagChatEngine`: the conventional RAG
  baselines, with file paths and ids kept out of the LM's prompt and follow-ups
  retrieved as NEST retrieves them.
* :class:`LlamaIndexVectorStoreRetriever`: a vector store you already have (or
  its ``VectorStoreIndex``) as the first stage of
  :func:`~nest_integrations.index.foreign_store.store_decoder`.
* :func:`node_to_passage`: a node as the passage the token datastore holds.

Needs ``llama-index-core``: ``pip install nest-integrations[llama-index]``.
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as err:
    raise ImportError(
        "nest_integrations.llama_index needs llama-index-core: pip install nest-integrations[llama-index]"
    ) from err

from ._common import default_embed_model, node_to_passage
from .baselines import HideMetadataFromLLM, RagChatEngine, rag_query_engine
from .chat_engine import NestChatEngine
from .first_stage import LlamaIndexVectorStoreRetriever
from .llms import NestLLM, citation_blocks
from .node_parsers import MarkdownSectionNodeParser
from .query_engine import NestQueryEngine, span_citations
from .vector_stores import NestVectorStore

__all__ = ["HideMetadataFromLLM", "LlamaIndexVectorStoreRetriever", "MarkdownSectionNodeParser", "NestChatEngine", "NestLLM", "NestQueryEngine", "NestVectorStore", "RagChatEngine", "citation_blocks", "default_embed_model", "node_to_passage", "rag_query_engine", "span_citations"]
