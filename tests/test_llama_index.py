"""LlamaIndex integration: NestLLM, NestVectorStore and NestQueryEngine on the tiny random Llama.

Everything is offline: a hashed bag-of-words embedding stands in for a real
embedder, and ``Settings.llm`` / ``Settings.embed_model`` are set explicitly.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from conftest import make_tiny_lm
from hash_embedding import HashEmbedding
from llama_index.core import Document, Settings, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.llms import ChatMessage, CitationBlock, MockLLM, TextBlock
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import CitationQueryEngine
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from nest_integrations.decoding.output import NestOutput, Span
from nest_integrations.decoding.rendering import cited_documents
from nest_integrations.decoding.spans import merge_spans
from nest_integrations.llama_index import NestLLM, NestQueryEngine, NestVectorStore, node_to_passage

PROMPT = "Tell me about Marie Curie."
# Retrieval dominates the random tiny LM: spans get proposed and accepted.
COPY = {"alpha": 5.0, "delta": 1.0, "gamma": 1e-6, "max_new_tokens": 24}
BASE = {"mode": "base", "max_new_tokens": 4}


@pytest.fixture(autouse=True)
def offline_settings(monkeypatch):
    """Explicit offline Settings for every test; the originals are restored afterwards."""
    monkeypatch.setattr(Settings, "_llm", None)
    monkeypatch.setattr(Settings, "_embed_model", None)
    Settings.llm = MockLLM()
    Settings.embed_model = HashEmbedding()


@pytest.fixture
def documents(small_passages) -> list[Document]:
    return [Document(text=p.text, id_=p.id, metadata={"title": p.title, **p.metadata}) for p in small_passages]


@pytest.fixture
def nest_index(documents) -> VectorStoreIndex:
    storage = StorageContext.from_defaults(vector_store=NestVectorStore())
    return VectorStoreIndex.from_documents(documents, storage_context=storage, embed_model=HashEmbedding())


@pytest.fixture
def llm(tiny_lm, nest_index) -> NestLLM:
    return NestLLM(tiny_lm, retriever=nest_index, config=COPY)


def assert_verbatim(output: NestOutput, texts: dict[str, str]) -> None:
    """Spans tile the text and every copied span is verbatim its node's text at its offsets."""
    assert "".join(span.text for span in output.spans) == output.text
    for span in output.copied_spans:
        assert span.source is not None
        assert texts[span.source.id][span.source.chunk_char_start : span.source.chunk_char_end] == span.text


def node_texts(store: NestVectorStore) -> dict[str, str]:
    return {node.node_id: node.get_content() for node in store.get_nodes()}


def make_node(node_id: str, doc_id: str, embedding: list[float], **metadata: Any) -> TextNode:
    return TextNode(
        id_=node_id,
        text=f"text of {node_id}",
        embedding=embedding,
        metadata=metadata,
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=doc_id)},
    )


@pytest.fixture
def store_nodes() -> list[TextNode]:
    return [
        make_node("a", "doc1", [1.0, 0.0, 0.0], topic="People", year=1867),
        make_node("b", "doc1", [0.9, 0.1, 0.0], topic="People", year=1912),
        make_node("c", "doc2", [0.0, 1.0, 0.0], topic="Fiction", year=2031),
        make_node("d", "doc3", [0.0, 0.0, 1.0], topic="Places", year=1900),
    ]


# --------------------------------------------------------------------------- import and metadata
def test_import_without_llama_index_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("nest_integrations.llama_index")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llama_index.core", None)
    with pytest.raises(ImportError, match=r"pip install nest-integrations\[llama-index\]"):
        importlib.import_module("nest_integrations.llama_index")


def test_metadata_and_lazy_loading(tiny_lm):
    llm = NestLLM(tiny_lm, config={"max_new_tokens": 7})
    meta = llm.metadata
    assert (meta.context_window, meta.num_output, meta.is_chat_model) == (512, 7, True)
    assert meta.model_name == tiny_lm.name and NestLLM.class_name() == "NestLLM"
    assert json.loads(llm.to_json())["config"]["max_new_tokens"] == 7  # serialisable, LM excluded
    assert NestLLM(tiny_lm, context_window=2048).metadata.context_window == 2048
    lazy = NestLLM("/nonexistent/model/folder")  # nothing is loaded before first use
    with pytest.raises(ValueError, match="Cannot load a causal LM"):
        _ = lazy.metadata
    with pytest.raises(TypeError, match="retriever"):
        NestLLM(tiny_lm, retriever=object())


# --------------------------------------------------------------------------- NestLLM
def test_complete_carries_the_output_contract(llm, nest_index):
    response = llm.complete(PROMPT)
    output = NestOutput.model_validate(response.additional_kwargs["nest"])
    assert output.text == response.text and output.mode == "nest"
    assert output.copied_spans and output.attribution_ratio > 0
    assert_verbatim(output, node_texts(nest_index.vector_store))


def test_formatted_prompt_bypasses_the_chat_template(tiny_lm):
    llm = NestLLM(tiny_lm, config=BASE)
    raw = llm.complete("Hello", formatted=True).additional_kwargs["nest"]["stats"]["prompt_tokens"]
    templated = llm.complete("Hello").additional_kwargs["nest"]["stats"]["prompt_tokens"]
    assert raw < templated


def test_stream_complete_deltas_rebuild_text_and_spans(llm):
    full = llm.complete(PROMPT)
    chunks = list(llm.stream_complete(PROMPT))
    assert "".join(c.delta for c in chunks) == full.text == chunks[-1].text
    assert all("nest" not in c.additional_kwargs for c in chunks[:-1])
    final = NestOutput.model_validate(chunks[-1].additional_kwargs["nest"])
    pieces = [Span.model_validate(s) for c in chunks for s in c.additional_kwargs["spans"]]
    assert merge_spans(pieces) == final.spans
    assert final.spans == NestOutput.model_validate(full.additional_kwargs["nest"]).spans


def test_chat_citation_blocks_match_copied_spans(llm, nest_index):
    messages = [ChatMessage(role="system", content="Answer briefly."), ChatMessage(role="user", content=PROMPT)]
    response = llm.chat(messages)
    output = NestOutput.model_validate(response.additional_kwargs["nest"])
    assert response.message.role == "assistant" and response.message.content == output.text
    blocks = [b for b in response.message.blocks if isinstance(b, CitationBlock)]
    assert isinstance(response.message.blocks[0], TextBlock) and len(blocks) == len(output.copied_spans) > 0
    documents = [doc.document for doc in cited_documents(output.spans)]
    ref_doc = {node.node_id: node.ref_doc_id for node in nest_index.vector_store.get_nodes()}
    for block, span in zip(blocks, output.copied_spans, strict=True):
        location = span.source.location
        assert block.cited_content.text == span.text
        # Nodes of documents named by their ids and read from no file: offsets known, lines unknown (left out).
        assert (block.source, block.title) == (location.document, span.source.title) == (ref_doc[span.source.id], span.source.title)
        assert block.additional_location_info == {
            "source_number": documents.index(location.document) + 1,
            "start_char_index": location.char_start,
            "end_char_index": location.char_end,
            "node_start_char_index": span.source.chunk_char_start,
            "node_end_char_index": span.source.chunk_char_end,
            "answer_start_char_index": span.start,
            "answer_end_char_index": span.end,
        }

    streamed = list(llm.stream_chat(messages))
    assert "".join(r.delta for r in streamed) == output.text
    assert streamed[-1].message.blocks == response.message.blocks


async def test_async_variants_match_sync(llm):
    messages = [ChatMessage(role="user", content=PROMPT)]
    text = llm.complete(PROMPT).text
    assert (await llm.acomplete(PROMPT)).text == text
    assert (await llm.achat(messages)).message.content == llm.chat(messages).message.content
    deltas = [r.delta async for r in await llm.astream_complete(PROMPT)]
    assert "".join(deltas) == text
    last = [r async for r in await llm.astream_chat(messages)][-1]
    assert last.message.content == text and "nest" in last.additional_kwargs


def test_plain_vector_store_index_retriever_as_first_stage(tiny_lm, documents):
    plain = VectorStoreIndex.from_documents(documents, embed_model=HashEmbedding())
    retriever = plain.as_retriever(similarity_top_k=2)
    llm = NestLLM(tiny_lm, retriever=retriever, config=COPY)
    assert llm.retriever is retriever
    output = llm.generate(PROMPT)
    retrieved = {hit.node.node_id: hit.node for hit in retriever.retrieve(PROMPT)}
    assert output.copied_spans and {s.id for s in output.sources} <= set(retrieved)
    assert_verbatim(output, {i: n.get_content() for i, n in retrieved.items()})
    for span in output.copied_spans:  # node metadata travels with the passage
        node = retrieved[span.source.id]
        assert span.source.title == node.metadata["title"] and span.source.metadata == node.metadata


def test_empty_index_falls_back_with_a_warning(tiny_lm):
    storage = StorageContext.from_defaults(vector_store=NestVectorStore())
    empty = VectorStoreIndex(nodes=[], storage_context=storage, embed_model=HashEmbedding())
    llm = NestLLM(tiny_lm, retriever=empty, config=COPY)
    output = NestOutput.model_validate(llm.complete(PROMPT).additional_kwargs["nest"])
    assert not output.copied_spans and output.attribution_ratio == 0.0
    assert output.stats.fallback_reason == "nothing_retrieved"


def test_no_retriever_generates_with_the_lm_and_says_so(tiny_lm):
    llm = NestLLM(tiny_lm, config={"max_new_tokens": 4})
    output = NestOutput.model_validate(llm.complete(PROMPT).additional_kwargs["nest"])
    assert output.stats.fallback_reason == "no_retriever" and not output.copied_spans
    assert output.text == llm.complete(PROMPT, mode="base").text


def test_relevance_gate_uses_the_embed_model(tiny_lm, nest_index):
    def gated(threshold: float) -> NestLLM:
        config = {**COPY, "min_passage_relevance": threshold}
        return NestLLM(tiny_lm, retriever=nest_index, embed_model=HashEmbedding(), config=config)

    refused = gated(0.99).generate(PROMPT)
    assert not refused.copied_spans and refused.stats.fallback_reason == "nothing_relevant"
    assert gated(0.0).generate(PROMPT).copied_spans


def test_stock_engines_run_with_nest_llm_as_settings_llm(tiny_lm, nest_index):
    # The tiny model has 512 positions; LlamaIndex's compact packing reserves 500
    # tokens, so the test reports a larger window (the decoder cuts long prompts).
    Settings.llm = NestLLM(tiny_lm, context_window=2048, config=BASE)
    assert isinstance(Settings.llm.predict(PromptTemplate("Say {word}."), word="hi"), str)
    rag = nest_index.as_query_engine(similarity_top_k=2).query("Who was Marie Curie?")
    assert isinstance(rag.response, str) and len(rag.source_nodes) == 2
    cited = CitationQueryEngine.from_args(nest_index, similarity_top_k=2).query("Who was Marie Curie?")
    assert isinstance(cited.response, str) and cited.source_nodes
    assert cited.source_nodes[0].node.get_content().startswith("Source 1:")


# --------------------------------------------------------------------------- NestQueryEngine
def test_query_engine_source_nodes_are_exactly_the_cited_ones(llm, nest_index):
    engine = NestQueryEngine.from_index(nest_index, llm, similarity_top_k=3)
    response = engine.query(PROMPT)
    citations = response.metadata["citations"]
    output = NestOutput.model_validate(response.metadata["nest"])
    assert citations and response.response == output.text
    assert [n.node_id for n in response.source_nodes] == list(dict.fromkeys(c["node_id"] for c in citations))
    scores = {hit.node_id: hit.score for hit in engine.retriever.retrieve(PROMPT)}
    assert all(n.score == pytest.approx(scores[n.node_id]) for n in response.source_nodes)
    texts = node_texts(nest_index.vector_store)
    docs = {n.node_id: n.ref_doc_id for n in nest_index.vector_store.get_nodes()}
    for c in citations:
        assert response.response[c["answer_start"] : c["answer_end"]] == c["text"]
        assert texts[c["node_id"]][c["chunk_char_start"] : c["chunk_char_end"]] == c["text"]
        assert "node_char_start" not in c and "node_char_end" not in c  # 0.1's names, removed in 0.2.0
        assert c["ref_doc_id"] == docs[c["node_id"]]


async def test_query_engine_ra_nest_and_async(llm, nest_index):
    engine = NestQueryEngine.from_index(nest_index, llm, similarity_top_k=3, mode="ra_nest")
    response = await engine.aquery(PROMPT)
    assert response.metadata["nest"]["mode"] == "ra_nest"
    assert {n.node_id for n in response.source_nodes} == {c["node_id"] for c in response.metadata["citations"]}


# --------------------------------------------------------------------------- NestVectorStore
def test_vector_store_add_query_filters_delete(store_nodes):
    store = NestVectorStore()
    assert store.add(store_nodes) == ["a", "b", "c", "d"]

    def ids(**query: Any) -> list[str]:
        return store.query(VectorStoreQuery(query_embedding=[1.0, 0.0, 0.1], **query)).ids

    assert ids(similarity_top_k=2) == ["a", "b"]
    people = MetadataFilter(key="topic", value="People")
    fiction_or_places = MetadataFilter(key="topic", value=["Fiction", "Places"], operator=FilterOperator.IN)
    late = MetadataFilter(key="year", value=1900, operator=FilterOperator.GT)
    assert ids(similarity_top_k=9, filters=MetadataFilters(filters=[people])) == ["a", "b"]
    assert ids(similarity_top_k=9, filters=MetadataFilters(filters=[fiction_or_places])) == ["d", "c"]
    assert ids(similarity_top_k=9, filters=MetadataFilters(filters=[people, late])) == ["b"]
    either = MetadataFilters(filters=[people, fiction_or_places], condition=FilterCondition.OR)
    assert sorted(ids(similarity_top_k=9, filters=either)) == ["a", "b", "c", "d"]
    nested = MetadataFilters(
        filters=[late, MetadataFilters(filters=[people, fiction_or_places], condition=FilterCondition.OR)]
    )
    assert ids(similarity_top_k=9, filters=nested) == ["b", "c"]
    assert ids(similarity_top_k=9, doc_ids=["doc2", "doc3"], node_ids=["c", "a"]) == ["c"]
    result = store.query(VectorStoreQuery(query_embedding=[1.0, 0.0, 0.0], similarity_top_k=1))
    assert result.similarities == [pytest.approx(1.0)] and result.nodes[0].get_content() == "text of a"

    assert [n.node_id for n in store.get_nodes(filters=MetadataFilters(filters=[people]))] == ["a", "b"]
    store.delete("doc1")
    assert [n.node_id for n in store.get_nodes()] == ["c", "d"]
    store.delete_nodes(node_ids=["c"])
    assert [n.node_id for n in store.get_nodes()] == ["d"]
    store.clear()
    assert store.get_nodes() == [] and ids(similarity_top_k=3) == []


def test_vector_store_rejects_bad_input(store_nodes):
    store = NestVectorStore()
    store.add(store_nodes)
    with pytest.raises(ValueError, match="no embedding"):  # all or nothing
        store.add([make_node("e", "doc4", [1.0, 0.0, 0.0]), TextNode(id_="x", text="no vector")])
    assert [n.node_id for n in store.get_nodes()] == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="3-d"):
        store.add([make_node("e", "doc4", [1.0, 0.0])])
    with pytest.raises(ValueError, match="default"):
        store.query(VectorStoreQuery(query_embedding=[1.0, 0.0, 0.0], mode=VectorStoreQueryMode.MMR))
    with pytest.raises(ValueError, match="key_layer"):
        NestVectorStore(key_layer="middle")


def test_vector_store_keeps_the_token_datastore_in_step(tiny_lm, store_nodes):
    store = NestVectorStore(lm=tiny_lm)
    store.add(store_nodes[:2])
    datastore = store.token_datastore()
    assert [p.id for p in datastore.passages] == ["a", "b"]
    store.add(store_nodes[2:])
    assert store.token_datastore() is datastore and [p.id for p in datastore.passages] == ["a", "b", "c", "d"]
    assert datastore.passages[0].metadata["topic"] == "People" and datastore.passages[0].doc_id == "doc1"
    store.delete("doc1")
    assert store.token_datastore() is datastore and [p.id for p in datastore.live_passages()] == ["c", "d"]
    assert [datastore.index_of(i) for i in ("c", "d")] == [2, 3], "the remaining nodes keep their slots and keys"
    replaced = store_nodes[2].model_copy()
    replaced.set_content("Replaced text.")
    store.add([replaced])
    assert store.token_datastore() is datastore and [p.id for p in datastore.live_passages()] == ["d", "c"]
    assert datastore.passages[datastore.index_of("c")].text == "Replaced text."
    other = make_tiny_lm(tiny_lm.tokenizer, seed=1)
    with pytest.raises(ValueError, match="other weights"):
        store.token_datastore(other)
    with pytest.raises(ValueError, match="no LM"):
        NestVectorStore().token_datastore()


def test_nest_index_shares_the_store_datastore(llm, nest_index):
    llm.complete(PROMPT)
    store = nest_index.vector_store
    assert store.lm is llm.lm
    assert {p.id for p in store.token_datastore().live_passages()} == set(node_texts(store))


def test_persist_round_trip_through_storage_context(tmp_path, nest_index):
    nest_index.storage_context.persist(persist_dir=str(tmp_path))
    assert (tmp_path / "default__vector_store.json").is_file()
    loaded = NestVectorStore.from_persist_dir(str(tmp_path))
    original = nest_index.vector_store
    assert node_texts(loaded) == node_texts(original) and loaded.key_layer == original.key_layer
    query = VectorStoreQuery(query_embedding=HashEmbedding().get_query_embedding(PROMPT), similarity_top_k=3)
    assert loaded.query(query).ids == original.query(query).ids
    storage = StorageContext.from_defaults(vector_store=loaded, persist_dir=str(tmp_path))
    index = load_index_from_storage(storage, embed_model=HashEmbedding())
    hits = index.as_retriever(similarity_top_k=1).retrieve(PROMPT)
    assert hits[0].node.metadata["title"] == "Marie Curie"


def test_tampered_or_incomplete_persist_folder_raises(tmp_path, store_nodes):
    path = tmp_path / "default__vector_store.json"
    NestVectorStore().persist(str(path))  # an empty store persists too
    assert NestVectorStore.from_persist_path(str(path)).get_nodes() == []
    store = NestVectorStore()
    store.add(store_nodes)
    store.persist(str(path))
    assert [n.node_id for n in NestVectorStore.from_persist_dir(str(tmp_path)).get_nodes()] == ["a", "b", "c", "d"]

    (nodes_file,) = tmp_path.glob("default__vector_store.nodes-*.json")
    nodes_file.write_text(nodes_file.read_text().replace("text of a", "text of z"))
    with pytest.raises(ValueError, match="checksum"):
        NestVectorStore.from_persist_dir(str(tmp_path))
    store.persist(str(path))
    next(tmp_path.glob("default__vector_store.embeddings-*.npy")).unlink()
    with pytest.raises(ValueError, match="missing"):
        NestVectorStore.from_persist_dir(str(tmp_path))
    path.write_text(json.dumps({"embedding_dict": {}}))  # e.g. a SimpleVectorStore file
    with pytest.raises(ValueError, match="not a NestVectorStore manifest"):
        NestVectorStore.from_persist_dir(str(tmp_path))


# --------------------------------------------------------------------------- standard parameters and limits
def test_standard_max_tokens_and_temperature_zero(tiny_lm, nest_index):
    knobs = {**COPY, "max_tokens": 5, "temperature": 0}
    knobs.pop("max_new_tokens")
    llm = NestLLM(tiny_lm, retriever=nest_index, **knobs)
    assert llm.config.max_new_tokens == llm.metadata.num_output == 5
    assert llm.config.temperature == 0
    output = NestOutput.model_validate(llm.complete(PROMPT, max_tokens=3).additional_kwargs["nest"])
    assert output.stats.new_tokens <= 3


def test_index_embed_model_serves_the_relevance_gate(tiny_lm, nest_index):
    assert isinstance(NestLLM(tiny_lm, retriever=nest_index).embed_model, HashEmbedding)


def test_structured_output_and_tool_calling_raise_clearly(llm):
    from pydantic import BaseModel

    class Answer(BaseModel):
        text: str

    for call in (
        lambda: llm.structured_predict(Answer, PromptTemplate("{q}"), q=PROMPT),
        lambda: llm.as_structured_llm(Answer),
        lambda: llm.predict_and_call([], PROMPT),
    ):
        with pytest.raises(NotImplementedError, match="structured output or tool calling"):
            call()


# --------------------------------------------------------------------------- streaming query engine
def test_streaming_query_engine_ends_with_the_citations_of_a_plain_query(llm, nest_index):
    from llama_index.core.base.response.schema import StreamingResponse

    plain = NestQueryEngine.from_index(nest_index, llm, similarity_top_k=3).query(PROMPT)
    streamed = NestQueryEngine.from_index(nest_index, llm, similarity_top_k=3, streaming=True).query(PROMPT)
    assert isinstance(streamed, StreamingResponse)
    assert "".join(streamed.response_gen) == plain.response
    assert streamed.metadata["citations"] == plain.metadata["citations"]
    assert [n.node_id for n in streamed.source_nodes] == [n.node_id for n in plain.source_nodes]


async def test_async_streaming_query_engine(llm, nest_index):
    from llama_index.core.base.response.schema import AsyncStreamingResponse

    engine = NestQueryEngine.from_index(nest_index, llm, similarity_top_k=3, streaming=True)
    streamed = await engine.aquery(PROMPT)
    assert isinstance(streamed, AsyncStreamingResponse)
    text = "".join([piece async for piece in streamed.response_gen])
    assert text == streamed.metadata["nest"]["text"]
    assert {n.node_id for n in streamed.source_nodes} == {c["node_id"] for c in streamed.metadata["citations"]}


# --------------------------------------------------------------------------- NestChatEngine
def test_chat_engine_keeps_citations_in_responses_and_history(llm, nest_index):
    from nest_integrations.llama_index import NestChatEngine

    engine = NestChatEngine.from_index(nest_index, llm, similarity_top_k=3)
    response = engine.chat(PROMPT)
    citations = response.metadata["citations"]
    assert citations and response.response == response.metadata["nest"]["text"]
    assert [n.node_id for n in response.source_nodes] == list(dict.fromkeys(c["node_id"] for c in citations))
    user, answer = engine.chat_history
    assert user.content == PROMPT and answer.blocks[0].text == response.response
    cited = [block for block in answer.blocks if isinstance(block, CitationBlock)]
    assert [block.source for block in cited] == [c["document"] for c in citations]
    engine.chat("And her birth year?")
    assert len(engine.chat_history) == 4
    engine.reset()
    assert engine.chat_history == []


def test_splitter_nodes_chain_into_their_document():
    from llama_index.core.node_parser import SentenceSplitter

    text = " ".join(f"Sentence number {i} tells the keeper's story of the northern cape." for i in range(30))
    nodes = SentenceSplitter(chunk_size=64, chunk_overlap=16).get_nodes_from_documents([Document(text=text, id_="keeper")])
    passages = [node_to_passage(node) for node in nodes]
    assert len(passages) > 2 and {p.doc_id for p in passages} == {"keeper"}
    assert all(text[p.doc_char_start : p.doc_char_end] == p.text for p in passages)
    starts = [p.doc_char_start for p in passages]
    assert starts == sorted(starts) and all(b <= a.doc_char_end + 2 for a, b in zip(passages, starts[1:])), "contiguous or overlapping"


def test_concurrent_async_completions_share_forwards(nest_index, tiny_lm, shared_rows):
    from conftest import held_back

    # The LM answers what the gate finds nothing for (no abstention), so every prompt decodes.
    llm = NestLLM(tiny_lm, retriever=nest_index, config={**COPY, "fallback": "lm"})
    llm._token_datastore(tiny_lm).precompute(show_progress=False)  # preparing a call then needs no LM forward
    prompts = ["Who was Marie Curie?", "Who was Alan Turing?", "Tell me about the comet catalogue."]
    alone = [llm.complete(p).text for p in prompts]

    async def gathered():
        return await asyncio.gather(*(llm.acomplete(p) for p in prompts))

    shared_rows.clear()
    holder = held_back(tiny_lm, len(prompts))
    responses = asyncio.run(gathered())
    holder.join()
    assert max(shared_rows) == len(prompts)
    assert [r.text for r in responses] == alone
    assert all("nest" in r.additional_kwargs for r in responses)
