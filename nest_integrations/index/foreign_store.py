"""A foreign vector store as NEST's first stage: the decoder over it, whatever the store.

A LangChain ``VectorStore`` (Qdrant, Chroma, PGVector...) or a LlamaIndex
vector store / ``VectorStoreIndex`` already holding a corpus can rank passages
for NEST through an adapter implementing
:class:`~nest_integrations.retrieval.base.PassageRetriever`:
:class:`~nest_integrations.langchain.first_stage.LangChainVectorStoreRetriever`
and :class:`~nest_integrations.llama_index.first_stage.LlamaIndexVectorStoreRetriever`
(each maps its framework's documents to passages, with ``doc_id`` /
``doc_char_start`` so a copy runs on into the next chunk of a document).
:func:`store_decoder` builds the :class:`~nest_integrations.decoding.decoder.NestDecoder`
over any such retriever. Nothing of the store is copied; the store decides
scores (its own scale) and NEST only uses their order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .vector_store_keys import lazy_datastore

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.core.config import NestConfig
    from nest_integrations.decoding.decoder import NestDecoder
    from nest_integrations.model.lm import LoadedLM

__all__ = ["store_decoder"]


def store_decoder(
    retriever: Any,
    lm: "LoadedLM",
    config: Optional["NestConfig"] = None,
    *,
    key_layer: str = "ffn_input",
    encoding_prefix: Optional[str] = "auto",
    cache_mb: float = 1024.0,
) -> "NestDecoder":
    """A NEST decoder whose first stage is ``retriever`` (e.g. a
    :class:`~nest_integrations.langchain.first_stage.LangChainVectorStoreRetriever`).

    The token datastore starts empty (:func:`~nest_integrations.index.vector_store_keys.lazy_datastore`):
    each passage the store returns is added when retrieved and encoded by ``lm``
    on first use, then kept in an LRU cache of ``cache_mb`` megabytes
    (``2 * hidden_size`` bytes per token), so the first generation over new
    passages pays their encoding (one LM forward per passage window). The
    relevance gate uses ``retriever.relevance`` when it has one.

    No calibration: a foreign store cannot list its documents to fit alpha/tau
    on, so a config that leaves them None gets the defaults (0.3 / 0.1, chosen
    on SmolLM2-135M-Instruct). For another LM, fit them on a
    :class:`~nest_integrations.index.nest_index.NestIndex` or a ``NestVectorStore`` over a
    sample of the corpus (``calibrate()``) and pass ``alpha`` / ``tau`` in ``config``.
    """
    from nest_integrations.decoding.decoder import NestDecoder

    datastore = lazy_datastore(lm, key_layer=key_layer, encoding_prefix=encoding_prefix, cache_mb=cache_mb)
    return NestDecoder(lm, datastore, retriever, config, relevance=getattr(retriever, "relevance", None))
