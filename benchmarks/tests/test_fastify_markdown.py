"""The library's Markdown reading over real documentation, the Fastify reference the
markdown-docs domain runs on: chunks keep code blocks whole, a splitter's chunk is read on its
own text, and the LangChain splitter's and LlamaIndex node parser's offsets are exact."""

from __future__ import annotations

import pytest

from nest_benchmarks.markdown_docs import FASTIFY_DOCS_DIR
from nest_integrations.corpus.chunking import DEFAULT_CHUNK_TOKENS, chunk_passages
from nest_integrations.corpus.markdown_structure import copyable_tokens, looks_like_markdown, parse_blocks
from nest_integrations.corpus.passages import Passage
from nest_integrations.store.encoder import tiling_char_spans

FASTIFY = FASTIFY_DOCS_DIR


def test_real_documentation_chunks_keep_code_blocks_whole(smol_tokenizer):
    doc = Passage(id="Reply.md", text=(FASTIFY / "Reply.md").read_text(encoding="utf-8"), metadata={"path": "Reply.md"})
    chunks = chunk_passages([doc], max_tokens=DEFAULT_CHUNK_TOKENS, tokenizer=smol_tokenizer)
    count = lambda s: len(smol_tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    assert all(count(c.text) <= DEFAULT_CHUNK_TOKENS for c in chunks)
    spans = [(c.doc_char_start, c.doc_char_end) for c in chunks]
    assert all(doc.text[a:b] == c.text for (a, b), c in zip(spans, chunks))
    blocks = parse_blocks(doc.text)
    for block in blocks:
        holders = [s for s in spans if s[0] < block.end and s[1] > block.start]
        if block.kind == "code" and count(doc.text[block.start : block.end]) <= DEFAULT_CHUNK_TOKENS:
            assert len(holders) == 1 and holders[0][0] <= block.start and block.end <= holders[0][1]
        if block.copyable:
            assert holders, "no readable block is dropped"
    heading_ends = {b.end for b in blocks if b.kind == "heading"}
    assert not heading_ends & {b for _, b in spans}


def test_a_splitter_chunk_is_read_on_its_own_text(smol_tokenizer):
    text = (FASTIFY / "Routes.md").read_text(encoding="utf-8")
    splitters = pytest.importorskip("langchain_text_splitters")
    chunks = splitters.RecursiveCharacterTextSplitter(add_start_index=True).create_documents([text])
    assert sum(looks_like_markdown(c.page_content) for c in chunks) >= len(chunks) - 3
    for chunk in chunks:
        ids = smol_tokenizer(chunk.page_content, add_special_tokens=False, return_offsets_mapping=True)
        spans = tiling_char_spans(ids["offset_mapping"], len(chunk.page_content))
        kept = "".join(chunk.page_content[s:e] for (s, e), ok in zip(spans.tolist(), copyable_tokens(chunk.page_content, spans)) if ok)
        assert "<a id=" not in kept and "\n## " not in kept and "\n### " not in kept


def test_langchain_splitter_offsets_are_exact():
    pytest.importorskip("langchain_text_splitters")
    from langchain_core.documents import Document

    from nest_integrations.langchain import MarkdownSectionSplitter, document_to_passage

    text = (FASTIFY / "Hooks.md").read_text(encoding="utf-8")
    splitter = MarkdownSectionSplitter(chunk_size=1500)
    docs = splitter.split_documents([Document(page_content=text, metadata={"source": "Hooks.md"})])
    assert len(docs) > 5 and splitter.split_text(text) == [d.page_content for d in docs]
    for doc in docs:
        start = doc.metadata["start_index"]
        assert text[start : start + len(doc.page_content)] == doc.page_content
        assert len(doc.page_content) <= 1500 or "```" in doc.page_content
        assert isinstance(doc.metadata["heading_path"], list)
        passage = document_to_passage(doc)
        assert passage.doc_id == "Hooks.md" and passage.doc_char_start == start
    with pytest.raises(ValueError, match="chunk_overlap"):
        MarkdownSectionSplitter(chunk_overlap=100)


def test_llama_index_node_parser_offsets_are_exact():
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document

    from nest_integrations.llama_index import MarkdownSectionNodeParser

    real = (FASTIFY / "Plugins.md").read_text(encoding="utf-8")
    for node in MarkdownSectionNodeParser(chunk_size=2000).get_nodes_from_documents([Document(text=real)]):
        assert real[node.start_char_idx : node.end_char_idx] == node.text
