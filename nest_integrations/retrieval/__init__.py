"""Passage retrievers: dense (FAISS + sentence embeddings), sparse (BM25) and hybrid.

Importing this package is cheap: faiss, bm25s and the embedder's libraries
(transformers for the bundled MiniLM, sentence_transformers for other models)
are imported only when a retriever or embedder is built.
"""

from .base import BatchRetrieverMixin, PassageRetriever, ScoredPassage
from .bm25 import BM25Retriever
from .dense import DenseRetriever, Embedder, default_embedder_path, load_embedder
from .faiss_index import FIRST_STAGES, IndexSpec
from .hybrid import FUSIONS, RETRIEVER_KINDS, HybridRetriever, build_retriever

__all__ = [
    "BM25Retriever",
    "BatchRetrieverMixin",
    "DenseRetriever",
    "Embedder",
    "FIRST_STAGES",
    "FUSIONS",
    "HybridRetriever",
    "IndexSpec",
    "PassageRetriever",
    "RETRIEVER_KINDS",
    "ScoredPassage",
    "build_retriever",
    "default_embedder_path",
    "load_embedder",
]
