"""Multi-turn retrieval: a follow-up that names nothing is searched with the earlier user turns.

A store of two documents (Python generators; argparse) and the conversation
"What is a generator in Python?" / an answer / "And how do I send a value into
it?". The follow-up alone names neither document; the retrieval query must
carry the generator question along, in LangChain's ``ChatNest`` (invoke and
stream) and in LlamaIndex's ``NestLLM.chat`` and ``NestChatEngine``. The tiny
random Llama of conftest.py generates; a hashed bag-of-words embedding ranks.
"""

from __future__ import annotations

from typing import Any

import pytest

from nest_integrations.policy.conversation import retrieval_query

GENERATORS = (
    "A generator is a function that uses yield to produce a sequence of values lazily. "
    "Calling send(value) on a generator resumes it and makes the paused yield expression return that value."
)
ARGPARSE = (
    "The argparse module parses command-line arguments. An ArgumentParser holds the argument specifications, "
    "add_argument declares one, and parse_args returns a namespace of the parsed values."
)
FIRST = "What is a generator in Python?"
ANSWER = "A generator is a function that yields values one at a time."
FOLLOW_UP = "And how do I send a value into it?"
KNOBS: dict[str, Any] = dict(alpha=5.0, delta=1.0, gamma=1e-6, max_new_tokens=8, min_passage_relevance=-1.0)


def test_the_rule_carries_the_generator_question():
    query = retrieval_query(
        [
            {"role": "user", "content": FIRST},
            {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": FOLLOW_UP},
        ]
    )
    assert query == f"{FIRST}\n{FOLLOW_UP}"
    assert ANSWER not in query


# --------------------------------------------------------------------------- LangChain
class _Spy:
    """Records every query a LangChain store is searched with."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queries: list[str] = []
        self.top: list[str] = []
        search = store.similarity_search_with_score

        def recording(query: str, *args: Any, **kwargs: Any) -> Any:
            hits = search(query, *args, **kwargs)
            self.queries.append(query)
            self.top.append(hits[0][0].id if hits else "")
            return hits

        monkeypatch.setattr(store, "similarity_search_with_score", recording)


@pytest.fixture
def lc_store(tiny_lm):
    pytest.importorskip("langchain_core")
    from hash_embedding import hashed_words
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings

    from nest_integrations.langchain import NestVectorStore

    class HashEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [hashed_words(t) for t in texts]

        def embed_query(self, text: str) -> list[float]:
            return hashed_words(text)

    docs = [
        Document(id="generators", page_content=GENERATORS, metadata={"title": "Generators"}),
        Document(id="argparse", page_content=ARGPARSE, metadata={"title": "argparse"}),
    ]
    return NestVectorStore.from_documents(docs, HashEmbeddings(), lm=tiny_lm)


def _lc_history() -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    return [SystemMessage(""), HumanMessage(FIRST), AIMessage(ANSWER), HumanMessage(FOLLOW_UP)]


@pytest.mark.parametrize("call", ["invoke", "stream"])
def test_chat_nest_follow_up_is_retrieved_with_the_history(tiny_lm, lc_store, monkeypatch, call):
    from nest_integrations.langchain import ChatNest

    spy = _Spy(lc_store, monkeypatch)
    chat = ChatNest.from_lm(tiny_lm, retriever=lc_store, **KNOBS)
    if call == "invoke":
        message = chat.invoke(_lc_history())
        metadata = message.response_metadata
    else:
        chunks = list(chat.stream(_lc_history()))
        metadata = chunks[-1].response_metadata
    assert spy.queries == [f"{FIRST}\n{FOLLOW_UP}"]
    assert spy.top == ["generators"]
    assert metadata["stats"]["new_tokens"] > 0


def test_chat_nest_self_contained_question_and_explicit_query(tiny_lm, lc_store, monkeypatch):
    from langchain_core.messages import AIMessage, HumanMessage

    from nest_integrations.langchain import ChatNest

    spy = _Spy(lc_store, monkeypatch)
    chat = ChatNest.from_lm(tiny_lm, retriever=lc_store, **KNOBS)
    new_topic = "How does argparse parse command-line arguments?"
    chat.invoke([HumanMessage(FIRST), AIMessage(ANSWER), HumanMessage(new_topic)])
    chat.invoke(_lc_history(), query="generator send")
    assert spy.queries == [new_topic, "generator send"]
    assert spy.top == ["argparse", "generators"]


# --------------------------------------------------------------------------- LlamaIndex
@pytest.fixture
def li_parts(tiny_lm):
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.base.base_retriever import BaseRetriever
    from hash_embedding import HashEmbedding

    from nest_integrations.llama_index import NestVectorStore

    class SpyRetriever(BaseRetriever):
        """Delegates to the index's retriever and records each query and its top node."""

        def __init__(self, inner: BaseRetriever) -> None:
            super().__init__()
            self.inner = inner
            self.queries: list[str] = []
            self.top: list[str] = []

        def _retrieve(self, query_bundle: Any) -> list[Any]:
            hits = self.inner.retrieve(query_bundle)
            self.queries.append(query_bundle.query_str)
            self.top.append(hits[0].node.ref_doc_id if hits else "")
            return hits

    documents = [
        Document(text=GENERATORS, id_="generators", metadata={"title": "Generators"}),
        Document(text=ARGPARSE, id_="argparse", metadata={"title": "argparse"}),
    ]
    embed_model = HashEmbedding()
    storage = StorageContext.from_defaults(vector_store=NestVectorStore())
    index = VectorStoreIndex.from_documents(documents, storage_context=storage, embed_model=embed_model)
    return index, SpyRetriever(index.as_retriever(similarity_top_k=2)), embed_model


def _li_history() -> list[Any]:
    from llama_index.core.llms import ChatMessage

    return [ChatMessage(role="user", content=FIRST), ChatMessage(role="assistant", content=ANSWER)]


@pytest.mark.parametrize("call", ["chat", "stream_chat"])
def test_llama_index_llm_chat_follow_up_is_retrieved_with_the_history(tiny_lm, li_parts, call):
    from llama_index.core.llms import ChatMessage

    from nest_integrations.llama_index import NestLLM

    _, spy, embed_model = li_parts
    llm = NestLLM(tiny_lm, retriever=spy, embed_model=embed_model, config=KNOBS)
    messages = [*_li_history(), ChatMessage(role="user", content=FOLLOW_UP)]
    if call == "chat":
        response = llm.chat(messages)
    else:
        response = list(llm.stream_chat(messages))[-1]
    assert spy.queries == [f"{FIRST}\n{FOLLOW_UP}"]
    assert spy.top == ["generators"]
    assert response.additional_kwargs["nest"]["stats"]["new_tokens"] > 0


def test_chat_engine_follow_up_is_retrieved_with_the_history(tiny_lm, li_parts):
    from nest_integrations.llama_index import NestChatEngine, NestLLM

    index, spy, embed_model = li_parts
    llm = NestLLM(tiny_lm, retriever=index, embed_model=embed_model, config=KNOBS)
    engine = NestChatEngine(spy, llm)
    response = engine.chat(FOLLOW_UP, chat_history=_li_history())
    assert spy.queries == [f"{FIRST}\n{FOLLOW_UP}"]
    assert spy.top == ["generators"]
    assert response.metadata["nest"]["stats"]["new_tokens"] > 0
    # the conversation goes on in the engine's own memory: a new topic is searched alone
    engine.chat("How does argparse parse command-line arguments?")
    engine.chat("And what does it return?")
    assert spy.queries[1:] == [
        "How does argparse parse command-line arguments?",
        "How does argparse parse command-line arguments?\nAnd what does it return?",
    ]
    assert spy.top[1:] == ["argparse", "argparse"]
