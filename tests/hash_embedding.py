"""A deterministic offline embedding for the tests: hashed counts of lower-cased words."""

from __future__ import annotations

import re
import zlib

from llama_index.core.base.embeddings.base import BaseEmbedding


def hashed_words(text: str, dim: int = 64) -> list[float]:
    """float (dim,) counts of ``text``'s lower-cased words, each in the slot its CRC-32 picks."""
    vector = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        vector[zlib.crc32(word.encode()) % dim] += 1.0
    return vector


class HashEmbedding(BaseEmbedding):
    """LlamaIndex's embedding interface over :func:`hashed_words`."""

    dim: int = 64

    def _get_query_embedding(self, query: str) -> list[float]:
        return hashed_words(query, self.dim)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return hashed_words(query, self.dim)

    def _get_text_embedding(self, text: str) -> list[float]:
        return hashed_words(text, self.dim)
