"""LlamaIndex integration: NEST as an LLM, a vector store and a query engine.

* :class:`NestLLM`: a LlamaIndex LLM generating with NEST over any retriever
  or index, with the output contract in every response's ``additional_kwargs``
  and ``CitationBlock``\\ s for copied spans in chat messages.
* :class:`NestVectorStore`: an in-memory vector store that keeps NEST's token
  datastore in step with its nodes, persisted without pickle.
* :class:`NestQueryEngine`: retrieve, generate, and return exactly the cited
  nodes with span-level citations (streamed too).
* :class:`NestChatEngine`: the same over a conversation, with citations kept
  in the chat history.
* :class:`MarkdownSectionNodeParser`: a node parser cutting Markdown along its
  sections, with exact ``start_char_idx``.
* :func:`rag_query_engine` and :class:`RagChatEngine`: the conventional RAG
  baselines, with file paths and ids kept out of the LM's prompt and follow-ups
  retrieved as NEST retrieves them.

Needs ``llama-index-core``: ``pip install nest-integrations[llama-index]``.
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as err:
    raise ImportError(
        "nest_integrations.llama_index needs llama-index-core: pip install nest-integrations[llama-index]"
    ) from err

from ._common import default_embed_model
from .baselines import HideMetadataFromLLM, RagChatEngine, rag_query_engine
from .chat_engine import NestChatEngine
from .llms import NestLLM, citation_blocks
from .node_parsers import MarkdownSectionNodeParser
from .query_engine import NestQueryEngine, span_citations
from .vector_stores import NestVectorStore

__all__ = ["HideMetadataFromLLM", "MarkdownSectionNodeParser", "NestChatEngine", "NestLLM", "NestQueryEngine", "NestVectorStore", "RagChatEngine", "citation_blocks", "default_embed_model", "rag_query_engine", "span_citations"]
