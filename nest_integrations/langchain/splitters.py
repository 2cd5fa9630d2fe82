"""A LangChain text splitter that cuts Markdown along its sections, with exact offsets.

LangChain's ``MarkdownHeaderTextSplitter`` returns sections without offsets
(and by default without their heading lines), so citations cannot be mapped
back into the file, and it has no size budget; ``RecursiveCharacterTextSplitter``
keeps offsets but cuts through code blocks and runs sections together.
:class:`MarkdownSectionSplitter` is a thin adapter over
:func:`nest_integrations.corpus.chunking.section_chunks`, the chunking ``nest index
build`` uses for Markdown.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from langchain_core.documents import Document
from langchain_text_splitters import TextSplitter

from nest_integrations.corpus.chunking import TextChunk, section_chunks
from nest_integrations.decoding.locations import START_LINE_FIELD


class MarkdownSectionSplitter(TextSplitter):
    """Split Markdown documents at headings, keeping code blocks whole (the rule of
    :func:`~nest_integrations.corpus.chunking.section_chunks`); a reStructuredText document is cut
    at its titles the same way.

    Each chunk is the document's exact text from ``metadata["start_index"]``
    on, with ``metadata["heading_path"]``, the headings it sits under, and
    ``metadata["start_line"]``, the 1-based line it starts on (citations give
    line ranges from it when the document's file cannot be read). Chunks
    do not overlap: a section boundary is a natural seam, and NEST continues a
    copy into the next chunk of the same document when both are retrieved.

    Args:
        chunk_size: the budget, in ``length_function`` units (characters by
            default, like LangChain's other splitters). Smaller chunks retrieve
            more precisely; larger ones give the token datastore more context.
        length_function: ``str -> int``; e.g. a tokenizer's token count
            (:meth:`TextSplitter.from_huggingface_tokenizer` works too).
        add_start_index: write ``start_index`` and ``start_line`` (on by
            default: NEST chains chunks of one document by the first, and
            citations name lines by the second).
    """

    def __init__(
        self,
        chunk_size: int = 4000,
        *,
        length_function: Callable[[str], int] = len,
        add_start_index: bool = True,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("chunk_overlap", 0):
            raise ValueError(f"chunk_overlap must be 0 for MarkdownSectionSplitter (sections do not overlap), got {kwargs['chunk_overlap']}")
        kwargs.pop("chunk_overlap", None)
        super().__init__(chunk_size=chunk_size, chunk_overlap=0, length_function=length_function, add_start_index=add_start_index, **kwargs)

    def _chunks(self, text: str) -> list[TextChunk]:
        return section_chunks(text, max_tokens=self._chunk_size, tokenizer=self._length_function)

    def split_text(self, text: str) -> list[str]:
        """The chunks' texts, in document order."""
        return [text[c.start : c.end] for c in self._chunks(text)]

    def create_documents(self, texts: list[str], metadatas: list[dict[Any, Any]] | None = None) -> list[Document]:
        """One Document per chunk of each text, with ``heading_path`` and (when on) the exact
        ``start_index`` and ``start_line``."""
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"metadatas has {len(metadatas)} entries for {len(texts)} texts")
        documents = []
        for i, text in enumerate(texts):
            for chunk in self._chunks(text):
                metadata = copy.deepcopy(metadatas[i]) if metadatas is not None else {}
                metadata["heading_path"] = list(chunk.heading_path)
                if self._add_start_index:
                    metadata["start_index"] = chunk.start
                    metadata[START_LINE_FIELD] = text.count("\n", 0, chunk.start) + 1
                documents.append(Document(page_content=text[chunk.start : chunk.end], metadata=metadata))
        return documents
