"""Passage retrievers: dense (FAISS + sentence embeddings), sparse (BM25) and hybrid.

Importing this package is cheap: faiss, sentence_transformers and bm25s are
imported only when a retriever or embedder is built.
"""

from .base import BatchRetrieverMixin, PassageRetriever, ScoredPassage
from .bm25 import BM25Retriever
from .dense import DenseRetriever, Embedder, default_embedder_path, load_embedder
from .hybrid import FUSIONS, RETRIEVER_KINDS, HybridRetriever, build_retriever

__all__ = [
    "BM25Retriever",
    "BatchRetrieverMixin",
    "DenseRetriever",
    "Embedder",
    "FUSIONS",
    "HybridRetriever",
    "PassageRetriever",
    "RETRIEVER_KINDS",
    "ScoredPassage",
    "build_retriever",
    "default_embedder_path",
    "load_embedder",
]
