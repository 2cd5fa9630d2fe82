"""LangChain integration: NestLLM, ChatNest, NestVectorStore and the helper chains.

Runs on the tiny random Llama of conftest.py. Its own predictions are noise, so
the tests use a configuration where retrieval dominates (alpha=5, delta=1,
gamma=1e-6): spans are copied from the retrieved documents, which lets the
tests check that ids and metadata survive from Document to span source.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from nest_integrations.core.config import NestConfig
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.decoding.output import Span
from nest_integrations.decoding.spans import merge_spans
from nest_integrations.langchain import (
    ChatNest,
    NestLLM,
    NestVectorStore,
    attributed_chain,
    cite,
    document_to_passage,
    format_docs,
    rag_chain,
)
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

KNOBS: dict[str, Any] = dict(alpha=5.0, delta=1.0, gamma=1e-6, max_new_tokens=12, min_passage_relevance=-1.0)
QUESTION = "Who was Marie Curie?"


# --------------------------------------------------------------------------- fixtures
@pytest.fixture
def docs(small_passages) -> list[Document]:
    return [
        Document(id=p.id, page_content=p.text, metadata={"title": p.title, **p.metadata, "source": f"wiki/{p.id}"})
        for p in small_passages
    ]


@pytest.fixture
def embeddings() -> DeterministicFakeEmbedding:
    return DeterministicFakeEmbedding(size=32)


@pytest.fixture
def store(docs, embeddings, tiny_lm) -> NestVectorStore:
    return NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm)


@pytest.fixture
def llm(tiny_lm, store) -> NestLLM:
    return NestLLM.from_lm(tiny_lm, retriever=store, **KNOBS)


@pytest.fixture
def chat(tiny_lm, store) -> ChatNest:
    return ChatNest.from_lm(tiny_lm, retriever=store, **KNOBS)


class TokenRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.chunks: list[Any] = []

    def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
        self.tokens.append(token)
        self.chunks.append(chunk)


class AsyncTokenRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


class RecordingRetriever(BaseRetriever):
    """A plain BaseRetriever (no vector store) that records its queries."""

    documents: list[Document]
    queries: list[str] = []

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        self.queries.append(query)
        return self.documents


def assert_sources_match(spans: list[dict[str, Any]], docs: list[Document]) -> int:
    """Every copied span is verbatim text of the document it names, with that
    document's metadata; returns the number of copied spans."""
    by_id = {d.id: d for d in docs}
    copied = [s for s in spans if s["copied"]]
    for span in copied:
        source = span["source"]
        doc = by_id[source["id"]]
        assert source["metadata"] == doc.metadata
        assert source["title"] == doc.metadata["title"]
        assert doc.page_content[source["chunk_char_start"] : source["chunk_char_end"]] == span["text"]
    return len(copied)


def citations_of(message: Any) -> tuple[str, list[dict[str, Any]]]:
    (block,) = [b for b in message.content_blocks if b["type"] == "text"]
    return block["text"], block.get("annotations", [])


# --------------------------------------------------------------------------- package
def test_import_without_langchain_core_names_the_extra():
    code = "import sys; sys.modules['langchain_core'] = None; import nest_integrations.langchain"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "pip install nest-integrations[langchain]" in result.stderr


def test_document_to_passage_keeps_id_title_metadata_and_hashes_stably():
    doc = Document(id="d1", page_content="Text.", metadata={"title": "T", "k": [1, 2]})
    passage = document_to_passage(doc)
    assert (passage.id, passage.text, passage.title, passage.metadata) == ("d1", "Text.", "T", {"title": "T", "k": [1, 2]})
    anonymous = Document(page_content="Text.", metadata={"k": 1})
    first, second = document_to_passage(anonymous), document_to_passage(anonymous.model_copy())
    assert first.id == second.id and first.id.startswith("doc-") and first.title == ""
    assert document_to_passage(Document(page_content="Text.", metadata={"k": 2})).id != first.id


def test_splitter_chunks_of_one_source_chain_into_one_document():
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    text = "First sentence of the notes. Second sentence of the notes. Third one."
    splitter = RecursiveCharacterTextSplitter(chunk_size=30, chunk_overlap=0, add_start_index=True)
    chunks = splitter.split_documents([Document(page_content=text, metadata={"source": "notes.txt"})])
    passages = [document_to_passage(chunk) for chunk in chunks]
    assert len(passages) > 1 and {p.doc_id for p in passages} == {"notes.txt"}
    assert all(text[p.doc_char_start : p.doc_char_end] == p.text for p in passages)
    unsourced = document_to_passage(Document(page_content="x", metadata={"start_index": 4}))
    assert (unsourced.doc_id, unsourced.doc_char_start) == ("", 0)


def test_copy_reaching_a_chunk_end_goes_on_when_the_next_chunk_was_retrieved(tiny_lm):
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    text = (
        "The lighthouse keeper logged every ship that passed the northern cape. "
        "Her notebooks record storms, fog banks and the slow return of the seals. "
        "In spring she repainted the lamp room and counted the gulls on the rocks. "
        "Visitors came by boat on Sundays to hear her stories of the winter gales."
    )
    splitter = RecursiveCharacterTextSplitter(chunk_size=60, chunk_overlap=0, add_start_index=True)

    def answer(metadata: dict[str, Any]) -> AIMessage:
        chunks = splitter.split_documents([Document(page_content=text, metadata=metadata)])
        for n, chunk in enumerate(chunks):
            chunk.id = f"chunk-{n}"
        store = NestVectorStore.from_documents(chunks, DeterministicFakeEmbedding(size=16), lm=tiny_lm)
        chat = ChatNest.from_lm(tiny_lm, retriever=store, **{**KNOBS, "max_new_tokens": 40}, passage_k=8)
        return chat.invoke("Tell me about the lighthouse keeper.")

    alone = answer({})  # chunks of no named document: each one ends a copy
    assert alone.response_metadata["finish_reason"] == "source_end"
    last = alone.response_metadata["spans"][-1]
    chunk_texts = {f"chunk-{n}": t for n, t in enumerate(splitter.split_text(text))}
    assert last["source"]["chunk_char_end"] == len(chunk_texts[last["source"]["id"]]), "the copy ran to its chunk's end"
    chained = answer({"source": "keeper.txt"})
    assert chained.text.startswith(alone.text) and len(chained.text) > len(alone.text)


def test_standard_parameters_and_unsupported_features(chat):
    assert chat.nest_config.max_new_tokens == KNOBS["max_new_tokens"]
    assert ChatNest(max_tokens=7, temperature=0).nest_config.max_new_tokens == 7
    assert chat._get_ls_params(max_tokens=3)["ls_max_tokens"] == 3
    assert chat.invoke(QUESTION, max_tokens=3).response_metadata["stats"]["new_tokens"] <= 3
    with pytest.raises(ValueError, match="disagree"):
        chat.invoke(QUESTION, max_tokens=3, max_new_tokens=4)
    with pytest.raises(NotImplementedError, match="structured output"):
        chat.with_structured_output({"title": "Answer", "type": "object"})
    with pytest.raises(NotImplementedError, match="tool calling"):
        chat.bind_tools([])


def test_config_fields_fold_into_nest_config_and_bad_options_raise(tiny_lm):
    llm = NestLLM.from_lm(tiny_lm, mode="rag", max_new_tokens=5, nest_config=NestConfig(gamma=0.1))
    assert (llm.nest_config.mode, llm.nest_config.max_new_tokens, llm.nest_config.gamma) == ("rag", 5, 0.1)
    assert llm._llm_type == "nest" and ChatNest.from_lm(tiny_lm)._llm_type == "nest-chat"
    params = llm._identifying_params
    assert params["model"] == tiny_lm.name and params["mode"] == "rag"
    assert llm._get_ls_params()["ls_provider"] == "nest"
    with pytest.raises(ValueError, match="NestConfig fields"):
        llm.invoke("hi", no_such_knob=1)
    with pytest.raises(ValueError):
        NestLLM(mode="nonsense")


def test_model_loads_lazily_once(monkeypatch, tiny_lm):
    calls = []

    def fake_load_lm(name: str, *, device: Any = None, dtype: Any = None) -> Any:
        calls.append((name, device, dtype))
        return tiny_lm

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", fake_load_lm)
    llm = NestLLM(model="some/model", device="cpu", mode="base", max_new_tokens=2)
    assert calls == []
    llm.invoke("hi")
    llm.invoke("hi")
    assert calls == [("some/model", "cpu", None)] and llm.lm is tiny_lm


# --------------------------------------------------------------------------- NestLLM
def test_llm_in_lcel_invoke_batch_stream_and_generation_info(llm, docs):
    chain = PromptTemplate.from_template("Answer: {question}") | llm
    text = chain.invoke({"question": QUESTION})
    assert isinstance(text, str) and text
    assert chain.batch([{"question": QUESTION}, {"question": QUESTION}]) == [text, text]
    assert "".join(chain.stream({"question": QUESTION})) == text

    result = llm.generate([f"Answer: {QUESTION}"])
    info = result.generations[0][0].generation_info
    assert info["text"] == text and info["mode"] == "nest"
    assert set(info) >= {"spans", "attribution_ratio", "mean_copied_span_tokens", "sources", "stats"}
    assert "".join(s["text"] for s in info["spans"]) == text
    assert assert_sources_match(info["spans"], docs) > 0
    assert info["attribution_ratio"] > 0.5
    assert info["finish_reason"] in {"eos", "stop", "length", "source_end"}


def test_llm_stream_chunks_carry_their_spans_and_callbacks_see_tokens(llm):
    expected = llm.generate([QUESTION]).generations[0][0].generation_info
    recorder = TokenRecorder()
    pieces = list(llm.stream(QUESTION, config={"callbacks": [recorder]}))
    assert "".join(recorder.tokens) == "".join(pieces) == expected["text"]
    spans = []
    for chunk in recorder.chunks:
        assert "".join(span["text"] for span in chunk.generation_info["spans"]) == chunk.text
        spans.extend(Span.model_validate(span) for span in chunk.generation_info["spans"])
    assert [s.model_dump(mode="json") for s in merge_spans(spans)] == expected["spans"]
    last = recorder.chunks[-1].generation_info
    assert last["attribution_ratio"] == expected["attribution_ratio"] and last["sources"] == expected["sources"]


async def test_llm_async_invoke_and_stream_do_not_block_the_loop(llm):
    expected = llm.invoke(QUESTION)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:  # runs whenever the loop is free; a blocking call would starve it
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0)
        before = ticks
        assert await llm.ainvoke(QUESTION) == expected
        assert ticks > before, "the event loop was blocked during ainvoke"
        recorder = AsyncTokenRecorder()
        before = ticks
        pieces = [p async for p in llm.astream(QUESTION, config={"callbacks": [recorder]})]
        assert "".join(pieces) == "".join(recorder.tokens) == expected
        assert ticks > before, "the event loop was blocked during astream"
        assert await llm.abatch([QUESTION, QUESTION]) == [expected, expected]
    finally:
        task.cancel()


def test_stop_sequences_cut_the_text(llm):
    full = llm.invoke(QUESTION)
    stop = full.strip().split()[1]
    cut = llm.invoke(QUESTION, stop=[stop])
    assert stop not in cut and full.startswith(cut)


def test_query_kwarg_sets_the_retrieval_query(tiny_lm, docs):
    retriever = RecordingRetriever(documents=docs[:1])
    llm = NestLLM.from_lm(tiny_lm, retriever=retriever, **KNOBS)
    llm.invoke(QUESTION)
    llm.invoke(QUESTION, query="radioactivity")
    assert retriever.queries == [QUESTION, "radioactivity"]
    info = llm.generate([QUESTION]).generations[0][0].generation_info
    assert {s["source"]["id"] for s in info["spans"] if s["copied"]} == {"curie"}


def test_in_memory_vector_store_as_first_stage(tiny_lm, docs, embeddings):
    memory = InMemoryVectorStore.from_documents(docs, embeddings)
    for retriever in (memory, memory.as_retriever(search_kwargs={"k": 3})):
        llm = NestLLM.from_lm(tiny_lm, retriever=retriever, **KNOBS)
        info = llm.generate([QUESTION]).generations[0][0].generation_info
        assert assert_sources_match(info["spans"], docs) > 0


def test_relevance_gate_uses_the_store_embeddings(tiny_lm, store, docs):
    # Fake embeddings are random except that equal texts embed equally: a query
    # equal to one document is relevant to it alone.
    llm = NestLLM.from_lm(tiny_lm, retriever=store, **{**KNOBS, "min_passage_relevance": 0.99})
    info = llm.generate([QUESTION], query=docs[1].page_content).generations[0][0].generation_info
    assert {s["source"]["id"] for s in info["spans"] if s["copied"]} == {"turing"}
    info = llm.generate([QUESTION], query="unrelated").generations[0][0].generation_info
    assert info["attribution_ratio"] == 0.0 and info["fallback_reason"] == "nothing_relevant"


def test_empty_store_or_no_retriever_falls_back_to_the_lm_and_says_why(tiny_lm, embeddings):
    plain = NestLLM.from_lm(tiny_lm, mode="base", max_new_tokens=8).invoke(QUESTION)
    for retriever, reason in (
        (NestVectorStore(embeddings), "nothing_retrieved"),
        (InMemoryVectorStore(embeddings), "nothing_retrieved"),
        (None, "no_retriever"),
    ):
        llm = NestLLM.from_lm(tiny_lm, retriever=retriever, **{**KNOBS, "max_new_tokens": 8, "lm_repeat_ngram": 0, "fallback": "lm"})
        assert llm.invoke(QUESTION) == plain  # the LM alone (without the repetition guard of NEST's picks)
        assert llm.generate([QUESTION]).generations[0][0].generation_info["fallback_reason"] == reason
        # By default a retriever that finds nothing gets a plain abstention; no retriever at all, the LM.
        info = NestLLM.from_lm(tiny_lm, retriever=retriever, **KNOBS).generate([QUESTION]).generations[0][0].generation_info
        assert (info["text"] == "The documents do not cover this question.") == (retriever is not None)
        assert (info["finish_reason"] == "not_covered") == (retriever is not None) and info["fallback_reason"] == reason


def test_from_decoder_sends_retrieved_documents_to_its_datastore(tiny_lm, docs):
    decoder = NestDecoder(tiny_lm, TokenDatastore([], PassageEncoder(tiny_lm)), config=NestConfig(**KNOBS))
    llm = NestLLM.from_decoder(decoder, retriever=RecordingRetriever(documents=docs[2:]))
    assert llm.nest_config.alpha == 5.0
    info = llm.generate([QUESTION]).generations[0][0].generation_info
    assert assert_sources_match(info["spans"], docs) > 0
    assert decoder.datastore.index_of("zoe") is not None
    with pytest.raises(ValueError, match="no token datastore"):
        NestLLM.from_decoder(NestDecoder(tiny_lm), retriever=RecordingRetriever(documents=docs))


# --------------------------------------------------------------------------- ChatNest
def test_chat_message_carries_citations_and_the_output_contract(chat, docs):
    message = chat.invoke([SystemMessage("Answer briefly."), HumanMessage(QUESTION)])
    assert isinstance(message, AIMessage)
    text, citations = citations_of(message)
    contract = message.response_metadata
    assert contract["text"] == text == message.text
    assert assert_sources_match(contract["spans"], docs) == len(citations) > 0
    by_id = {d.id: d for d in docs}
    for citation in citations:
        assert citation["type"] == "citation"
        assert text[citation["start_index"] : citation["end_index"]] == citation["cited_text"]
        doc = by_id[citation["extras"]["source_id"]]
        assert citation["title"] == doc.metadata["title"] and citation["extras"]["metadata"] == doc.metadata
        extras = citation["extras"]
        assert doc.page_content[extras["chunk_char_start"] : extras["chunk_char_end"]] == citation["cited_text"]
        assert "source_char_start" not in extras and "source_char_end" not in extras  # 0.1's names, removed in 0.2.0
        # Each document is whole (no start_index): its range is the chunk range, on its one line.
        assert extras["document"] == doc.metadata["source"]
        assert (extras["doc_char_start"], extras["doc_char_end"]) == (extras["chunk_char_start"], extras["chunk_char_end"])
        assert (extras["line_start"], extras["line_end"]) == (1, 1)
    numbers = [c["extras"]["source_number"] for c in citations]
    documents = list(dict.fromkeys(c["extras"]["document"] for c in citations))
    assert numbers == [documents.index(c["extras"]["document"]) + 1 for c in citations]
    assert message.usage_metadata["output_tokens"] == contract["stats"]["new_tokens"]
    assert contract["finish_reason"] == contract["stats"]["finish_reason"] in {"eos", "stop", "length", "source_end"}


def test_chat_stream_merges_into_the_invoked_message(chat):
    recorder = TokenRecorder()
    invoked = chat.invoke(QUESTION)
    chunks = list(chat.stream(QUESTION, config={"callbacks": [recorder]}))
    assert len(chunks) > 2
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert citations_of(merged) == citations_of(invoked)
    assert citations_of(merged)[1]
    timing = {"stats", "model_name"}  # wall times differ; keys are encoded once and cached
    assert {k: v for k, v in merged.response_metadata.items() if k not in timing} == {
        k: v for k, v in invoked.response_metadata.items() if k not in timing
    }
    assert merged.response_metadata["stats"]["new_tokens"] == invoked.response_metadata["stats"]["new_tokens"]
    assert merged.usage_metadata == invoked.usage_metadata
    assert citations_of(chat.invoke(QUESTION, stream=True)) == citations_of(invoked)  # invoke through _stream
    assert len(recorder.chunks) == len(chunks)  # once per chunk; a chat model's token is its content
    assert "".join(chunk.text for chunk in recorder.chunks) == invoked.text


async def test_chat_async_and_lcel(chat):
    prompt = ChatPromptTemplate.from_messages([("system", "You answer questions."), ("human", "{question}")])
    chain = prompt | chat
    invoked = chain.invoke({"question": QUESTION})
    assert (await chain.ainvoke({"question": QUESTION})).content == invoked.content
    chunks = [c async for c in chain.astream({"question": QUESTION})]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert citations_of(merged) == citations_of(invoked)
    batch = chain.batch([{"question": QUESTION}] * 2)
    assert [m.content for m in batch] == [invoked.content] * 2


def test_chat_rejects_tool_messages(chat):
    with pytest.raises(ValueError, match="'tool' messages"):
        chat.invoke([HumanMessage("hi"), ToolMessage("42", tool_call_id="t1")])


# --------------------------------------------------------------------------- NestVectorStore
def test_vector_store_keeps_the_token_datastore_in_step(tiny_lm, store, docs):
    datastore = store.token_datastore()
    assert [p.id for p in datastore.passages] == [d.id for d in docs]
    store.add_documents([Document(id="new", page_content="A new passage.", metadata={"title": "New"})])
    assert store.token_datastore() is datastore and datastore.index_of("new") is not None
    store.delete(["turing"])
    assert store.token_datastore() is datastore and datastore.index_of("turing") is None
    assert [datastore.index_of(i) for i in ("curie", "zoe")] == [0, 2], "the others keep their slots and keys"
    store.add_documents([Document(id="curie", page_content=docs[0].page_content, metadata={"title": "Curie", "v": 2})])
    llm = NestLLM.from_lm(tiny_lm, retriever=store, passage_k=1, **KNOBS)
    info = llm.generate([QUESTION], query=docs[0].page_content).generations[0][0].generation_info
    assert {s["source"]["metadata"]["v"] for s in info["spans"] if s["copied"]} == {2}
    other = NestVectorStore(store.embeddings)
    other.token_datastore(tiny_lm)
    with pytest.raises(ValueError, match="no LM"):
        NestVectorStore(store.embeddings).token_datastore()


def test_vector_store_refuses_an_lm_other_than_its_own(store, smol_tokenizer):
    from conftest import make_tiny_lm

    with pytest.raises(ValueError, match="cannot serve"):
        store.token_datastore(make_tiny_lm(smol_tokenizer, seed=1))


def test_vector_store_search_filters_and_scores(store, docs):
    hits = store.similarity_search_with_score(docs[0].page_content, k=3)
    assert hits[0][0] == docs[0] and hits[0][1] == pytest.approx(1.0)
    assert [d.id for d in store.similarity_search(docs[0].page_content, k=3, filter={"topic": "Fiction"})] == ["zoe"]
    assert store.similarity_search("x", k=3, filter=lambda d: d.id == "turing")[0].id == "turing"
    relevance = store.similarity_search_with_relevance_scores(docs[0].page_content, k=3)
    assert all(0.0 <= score <= 1.0 for _, score in relevance)
    assert store.max_marginal_relevance_search(docs[0].page_content, k=2)[0].id == "curie"
    assert store.as_retriever(search_kwargs={"k": 1}).invoke(docs[1].page_content)[0].id == "turing"


def test_save_and_load_local_round_trip(tmp_path, store, docs, embeddings, tiny_lm):
    folder = store.save_local(tmp_path / "store")
    assert sorted(p.name for p in folder.iterdir()) == ["documents.json", "keys", "manifest.json", "vectors.npy"]
    loaded = NestVectorStore.load_local(folder, embeddings, lm=tiny_lm)
    assert loaded.get_by_ids([d.id for d in docs]) == docs
    query = docs[2].page_content
    assert loaded.similarity_search_with_score(query, k=3) == store.similarity_search_with_score(query, k=3)
    with pytest.raises(ValueError, match="overwrite=True"):
        store.save_local(folder)
    store.save_local(folder, overwrite=True)


def test_save_local_never_replaces_other_folders(tmp_path, store):
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="not a saved"):
        store.save_local(tmp_path / "thesis", overwrite=True)
    assert (tmp_path / "thesis" / "thesis.tex").read_text() == "years of work"
    assert [p.name for p in tmp_path.iterdir()] == ["thesis"], "no temporary folder stays behind"


@pytest.mark.parametrize("tamper", ["documents", "vectors", "manifest", "missing"])
def test_load_local_of_a_tampered_folder_fails_clearly(tmp_path, store, embeddings, tamper):
    folder = store.save_local(tmp_path / "store")
    if tamper == "documents":
        data = json.loads((folder / "documents.json").read_text())
        data["documents"][0]["metadata"]["title"] = "Forged"
        (folder / "documents.json").write_text(json.dumps(data))
        match = "documents.json does not match its checksum"
    elif tamper == "vectors":
        np.save(folder / "vectors.npy", np.zeros((3, 32), dtype=np.float32))
        match = "vectors.npy does not match its checksum"
    elif tamper == "manifest":
        (folder / "manifest.json").write_text("{not json")
        match = "not valid JSON"
    else:
        (folder / "vectors.npy").unlink()
        match = "vectors.npy is missing"
    with pytest.raises(ValueError, match=match):
        NestVectorStore.load_local(folder, embeddings)
    with pytest.raises(ValueError, match="not a saved NestVectorStore"):
        NestVectorStore.load_local(tmp_path / "nowhere", embeddings)


def test_non_json_metadata_is_refused_when_added(embeddings):
    store = NestVectorStore.from_texts(["a"], embeddings)
    with pytest.raises(ValueError, match=r"metadatas\[0\]\['bad'\] is a builtins.object, which cannot be made JSON"):
        store.add_texts(["x"], metadatas=[{"bad": object()}])
    assert len(store) == 1


def test_save_local_refuses_non_json_metadata(tmp_path, embeddings):
    store = NestVectorStore.from_texts(["x"], embeddings, metadatas=[{"bad": float("nan")}])
    with pytest.raises(ValueError, match="JSON-serialisable"):
        store.save_local(tmp_path / "store")
    assert not (tmp_path / "store").exists()


# --------------------------------------------------------------------------- chains
def test_format_docs_and_rag_chain(tiny_lm, store, docs):
    assert format_docs(docs[:2]).startswith("[1] Marie Curie: Marie Curie was")
    assert "\n\n[2] Alan Turing: " in format_docs(docs[:2])
    llm = NestLLM.from_lm(tiny_lm, mode="base", max_new_tokens=6)
    result = rag_chain(store.as_retriever(search_kwargs={"k": 2}), llm).invoke(QUESTION)
    assert result["question"] == QUESTION and len(result["sources"]) == 2
    assert isinstance(result["answer"], str) and result["answer"]


def test_attributed_chain_and_cite(chat, docs):
    message = attributed_chain(chat).invoke(QUESTION)
    assert message.response_metadata["fallback_reason"] is None
    text, citations = citations_of(message)
    rendered = (attributed_chain(chat) | cite).invoke(QUESTION)
    assert rendered == cite.invoke(message) == cite.invoke(message.response_metadata)
    answer, listing = rendered.split("\n\nSources:\n")
    assert "[1]" in answer
    lines = listing.splitlines()
    cited = list(dict.fromkeys(c["extras"]["document"] for c in citations))
    assert len(lines) == len(cited) and all(line.startswith(f"[{n}] {doc} (") for n, (line, doc) in enumerate(zip(lines, cited), start=1))
    for citation in citations:
        extras = citation["extras"]
        line = lines[extras["source_number"] - 1]
        assert f"line 1, chars {extras['doc_char_start']}-{extras['doc_char_end']}" in line
    assert answer.replace("[1]", "").replace("[2]", "").replace("[3]", "") == text.strip()
    plain = {"text": "plain", "mode": "base", "spans": [{"text": "plain", "start": 0, "end": 5, "copied": False}]}
    assert cite.invoke(plain) == "plain[model]\n\nSources:\n[model] written by the language model, not copied from any source"
    with pytest.raises(ValueError, match="not a NEST result"):
        cite.invoke({"answer": "x"})


# --------------------------------------------------------------------------- concurrency
QUESTIONS = ["Who was Marie Curie?", "Who was Alan Turing?", "Tell me about the comet catalogue.", "What is radioactivity?"]


def _precomputed(store, lm):
    store.token_datastore(lm).precompute(show_progress=False)  # preparing a call then needs no LM forward


def test_chat_batch_and_abatch_decode_in_one_shared_batch(chat, store, tiny_lm, shared_rows):
    from conftest import held_back

    _precomputed(store, tiny_lm)
    alone = [chat.invoke(q) for q in QUESTIONS]
    shared_rows.clear()
    holder = held_back(tiny_lm, len(QUESTIONS))
    batched = chat.batch(QUESTIONS)
    holder.join()
    assert max(shared_rows) == len(QUESTIONS)
    assert [m.content for m in batched] == [m.content for m in alone]

    shared_rows.clear()
    holder = held_back(tiny_lm, len(QUESTIONS))
    gathered = asyncio.run(chat.abatch(QUESTIONS))
    holder.join()
    assert max(shared_rows) == len(QUESTIONS)
    assert [m.content for m in gathered] == [m.content for m in alone]
    assert [m.response_metadata["spans"] for m in gathered] == [m.response_metadata["spans"] for m in alone]


def test_llm_batch_shares_forwards_and_async_streams_stream(llm, store, tiny_lm, shared_rows):
    from conftest import held_back

    _precomputed(store, tiny_lm)
    alone = [llm.invoke(q) for q in QUESTIONS]
    shared_rows.clear()
    holder = held_back(tiny_lm, len(QUESTIONS))
    assert llm.batch(QUESTIONS) == alone
    holder.join()
    assert max(shared_rows) == len(QUESTIONS)

    async def streams():
        async def one(q):
            return [chunk async for chunk in llm.astream(q)]

        return await asyncio.gather(*(one(q) for q in QUESTIONS))

    shared_rows.clear()
    holder = held_back(tiny_lm, len(QUESTIONS))
    pieces = asyncio.run(streams())
    holder.join()
    assert max(shared_rows) == len(QUESTIONS)
    assert ["".join(p) for p in pieces] == alone
