"""The conventional RAG baselines (LangChain ``rag_chain``, LlamaIndex ``rag_query_engine`` and
``RagChatEngine``): a follow-up is retrieved with the earlier questions, as NEST retrieves it, and
the LM's prompt holds the passages' texts but never their file paths or ids."""

from __future__ import annotations

from typing import Any

import pytest

PATH = "/home/someone/projects/quill/docs/os.md"
CONVERSATION = [
    ("human", "Where does quill keep its cache?"),
    ("ai", "In the cache folder."),
    ("human", "And how do I override it?"),
]
FOLLOW_UP_QUERY = "Where does quill keep its cache?\nAnd how do I override it?"
CACHE_TEXT = "Quill keeps its cache in ~/.cache/quill; set QUILL_CACHE to override it for one run."


# --------------------------------------------------------------------------- LangChain
@pytest.fixture
def lc_retriever():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class Recording(BaseRetriever):
        queries: list = []

        def _get_relevant_documents(self, query, *, run_manager=None):
            self.queries.append(query)
            return [Document(CACHE_TEXT, id="5f0c1a2b-chunk-uuid", metadata={"title": "os", "source": PATH, "path": PATH, "start_index": 0})]

    return Recording(queries=[])


def recording_llm(seen: list[Any]):
    from langchain_core.runnables import RunnableLambda

    return RunnableLambda(lambda prompt: (seen.append(prompt), "Set QUILL_CACHE.")[1])


def test_rag_chain_retrieves_a_follow_up_with_the_conversation_and_gives_the_lm_its_turns(lc_retriever):
    from nest_integrations.langchain import rag_chain

    seen: list[Any] = []
    result = rag_chain(lc_retriever, recording_llm(seen)).invoke(CONVERSATION)
    assert lc_retriever.queries == [FOLLOW_UP_QUERY]
    assert result["question"] == "And how do I override it?" and result["query"] == FOLLOW_UP_QUERY
    assert result["answer"] == "Set QUILL_CACHE." and result["sources"][0].metadata["source"] == PATH
    messages = seen[0].to_messages()
    assert [m.type for m in messages] == ["human", "ai", "human"]
    assert messages[0].text == "Where does quill keep its cache?" and messages[1].text == "In the cache folder."
    assert CACHE_TEXT in messages[2].text and messages[2].text.endswith("Question: And how do I override it?")


@pytest.mark.parametrize("question", ["Where does quill keep its cache?", CONVERSATION])
def test_rag_chain_keeps_paths_and_ids_out_of_the_lm_prompt(lc_retriever, question):
    from nest_integrations.langchain import rag_chain

    seen: list[Any] = []
    rag_chain(lc_retriever, recording_llm(seen)).invoke(question)
    prompt = seen[0].to_string()
    assert CACHE_TEXT in prompt and "[1] os: " in prompt
    assert PATH not in prompt and "os.md" not in prompt and "5f0c1a2b" not in prompt


def test_rag_chain_refuses_a_conversation_that_does_not_end_with_a_question(lc_retriever):
    from nest_integrations.langchain import rag_chain

    with pytest.raises(ValueError, match="must end with the user's question"):
        rag_chain(lc_retriever, recording_llm([])).invoke(CONVERSATION[:2])


def test_rag_chain_answers_a_conversation_with_nest_models_in_base_mode(tiny_lm, lc_retriever):
    """A chat model reads the turns as messages, an LLM as their transcript; both answer."""
    from nest_integrations.langchain import ChatNest, NestLLM, rag_chain

    for llm in (ChatNest.from_lm(tiny_lm, mode="base", max_new_tokens=3), NestLLM.from_lm(tiny_lm, mode="base", max_new_tokens=3)):
        result = rag_chain(lc_retriever, llm).invoke(CONVERSATION)
        assert isinstance(result["answer"], str) and result["answer"]


# --------------------------------------------------------------------------- LlamaIndex
@pytest.fixture
def li_index():
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from test_llama_index import HashEmbedding

    from nest_integrations.llama_index import NestVectorStore

    documents = [
        Document(text=CACHE_TEXT, id_="os-doc", metadata={"title": "os", "file_path": PATH, "file_name": "os.md"}),
        Document(text="Quill prints its version with quill --version.", id_="cli-doc", metadata={"title": "cli", "file_path": "/x/cli.md"}),
    ]
    storage = StorageContext.from_defaults(vector_store=NestVectorStore())
    return VectorStoreIndex.from_documents(documents, storage_context=storage, embed_model=HashEmbedding())


@pytest.fixture
def recording_li_llm():
    from llama_index.core.llms import CustomLLM
    from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
    from llama_index.core.base.llms.types import ChatResponse, ChatMessage, CompletionResponse, LLMMetadata

    class Recording(CustomLLM):
        prompts: list = []

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(context_window=4096, num_output=16)

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            self.prompts.append(prompt)
            return CompletionResponse(text="Set QUILL_CACHE.")

        @llm_completion_callback()
        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any):
            yield self.complete(prompt)

        @llm_chat_callback()
        def chat(self, messages, **kwargs: Any) -> ChatResponse:
            self.prompts.append(list(messages))
            return ChatResponse(message=ChatMessage(role="assistant", content="Set QUILL_CACHE."))

    return Recording(prompts=[])


def test_rag_query_engine_keeps_paths_out_of_the_lm_prompt(li_index, recording_li_llm):
    from nest_integrations.llama_index import rag_query_engine

    response = rag_query_engine(li_index, recording_li_llm, similarity_top_k=2).query("Where does quill keep its cache?")
    prompt = str(recording_li_llm.prompts[-1])
    assert CACHE_TEXT in prompt and "title: os" in prompt
    assert PATH not in prompt and "os.md" not in prompt and "file_path" not in prompt
    assert {hit.node.metadata["file_path"] for hit in response.source_nodes} == {PATH, "/x/cli.md"}  # kept for the reader
    stock = li_index.as_query_engine(llm=recording_li_llm, similarity_top_k=2)
    stock.query("Where does quill keep its cache?")
    assert PATH in str(recording_li_llm.prompts[-1])  # what the baseline used to show the LM


def test_rag_chat_engine_retrieves_a_follow_up_as_nest_chat_engine_does(li_index, recording_li_llm, tiny_lm):
    from llama_index.core.base.llms.types import ChatMessage

    from nest_integrations.llama_index import NestChatEngine, NestLLM, RagChatEngine

    queries: dict[str, list[str]] = {"rag": [], "nest": []}

    def recording(name):
        retriever = li_index.as_retriever(similarity_top_k=1)
        retrieve = retriever.retrieve

        def record(query):
            queries[name].append(str(query))
            return retrieve(query)

        retriever.retrieve = record
        return retriever

    history = [ChatMessage(role="user", content=CONVERSATION[0][1]), ChatMessage(role="assistant", content=CONVERSATION[1][1])]
    rag = RagChatEngine(recording("rag"), recording_li_llm)
    reply = rag.chat(CONVERSATION[2][1], chat_history=history)
    nest = NestChatEngine(recording("nest"), NestLLM(tiny_lm, config={"max_new_tokens": 3}))
    nest.chat(CONVERSATION[2][1], chat_history=history)
    assert len(history) == 2  # the caller's list is left as it was by both engines
    assert len(nest.chat_history) == 4
    assert queries["rag"] == queries["nest"] == [FOLLOW_UP_QUERY]
    assert reply.response == "Set QUILL_CACHE." and reply.source_nodes[0].node.metadata["file_path"] == PATH
    messages = recording_li_llm.prompts[-1]
    assert [m.content for m in messages[:2]] == [CONVERSATION[0][1], CONVERSATION[1][1]]
    assert CACHE_TEXT in messages[2].content and messages[2].content.rstrip().endswith("Query: And how do I override it?\nAnswer:")
    assert PATH not in messages[2].content and "os.md" not in messages[2].content
    assert [m.content for m in rag.chat_history] == [CONVERSATION[0][1], CONVERSATION[1][1], CONVERSATION[2][1], "Set QUILL_CACHE."]
