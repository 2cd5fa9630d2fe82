"""LangChain integration of NEST: attributed, retrieval-grounded generation.

* :class:`NestLLM` -- a ``BaseLLM``; the output contract rides in ``generation_info``.
* :class:`ChatNest` -- a ``BaseChatModel``; copied spans become standard citations.
* :class:`NestVectorStore` -- a ``VectorStore`` that keeps NEST's token datastore in sync.
* :class:`MarkdownSectionSplitter` -- a ``TextSplitter`` cutting Markdown along its sections, exact offsets.
* :mod:`.chains` -- :func:`format_docs`, :func:`rag_chain`, :func:`history_aware_retriever`, :func:`attributed_chain`, :data:`cite`.
* :class:`LangChainVectorStoreRetriever` -- a store you already have as the first stage of
  :func:`~nest_integrations.index.foreign_store.store_decoder`; :func:`write_qdrant` and
  :func:`open_qdrant` for Qdrant's local mode (extra ``qdrant``).

Any LangChain ``BaseRetriever`` or ``VectorStore`` can serve the passage stage.
Needs ``pip install nest-integrations[langchain]``.
"""

try:
    import langchain_core  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "nest_integrations.langchain needs langchain-core: pip install nest-integrations[langchain]"
    ) from err

from .documents import default_embeddings, document_to_passage
from .chains import attributed_chain, cite, cite_text, format_docs, history_aware_retriever, nest_output_of, rag_chain
from .chat_models import ChatNest
from .first_stage import LangChainVectorStoreRetriever
from .llms import NestLLM
from .qdrant import open_qdrant, write_qdrant
from .splitters import MarkdownSectionSplitter
from .vectorstores import NestVectorStore

__all__ = [
    "ChatNest",
    "LangChainVectorStoreRetriever",
    "MarkdownSectionSplitter",
    "NestLLM",
    "NestVectorStore",
    "attributed_chain",
    "cite",
    "cite_text",
    "default_embeddings",
    "document_to_passage",
    "format_docs",
    "history_aware_retriever",
    "nest_output_of",
    "open_qdrant",
    "rag_chain",
    "write_qdrant",
]
