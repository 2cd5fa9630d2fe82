"""Metadata of numpy, date and other convertible types round-trips through the output contract and
the LangChain / LlamaIndex responses; what cannot be made JSON is refused when the document is added."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nest_integrations.core.jsonsafe import MAX_DEPTH, json_safe
from nest_integrations.corpus.chunking import chunk_passages
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

COPY: dict[str, Any] = dict(alpha=5.0, delta=1.0, gamma=1e-6, max_new_tokens=12, min_passage_relevance=-1.0)
TEXT = "Marie Curie was a Polish and naturalised-French physicist and chemist who conducted pioneering research."
RAW = {
    "score": np.float32(0.5),
    "rows": np.int64(7),
    "flag": np.bool_(True),
    "vector": np.arange(3, dtype=np.int32),
    "grid": np.ones((2, 2), dtype=np.float16),
    "born": dt.date(1867, 11, 7),
    "seen": dt.datetime(2024, 5, 1, 12, 30),
    "stamp": np.datetime64("2024-05-01"),
    "path": Path("/data/curie.txt"),
    "pair": (1, np.float64(2.5)),
    "nested": {"inner": [np.int8(1), {"deep": dt.time(8, 15)}]},
}
CONVERTED = {
    "score": 0.5,
    "rows": 7,
    "flag": True,
    "vector": [0, 1, 2],
    "grid": [[1.0, 1.0], [1.0, 1.0]],
    "born": "1867-11-07",
    "seen": "2024-05-01T12:30:00",
    "stamp": "2024-05-01",
    "path": "/data/curie.txt",
    "pair": [1, 2.5],
    "nested": {"inner": [1, {"deep": "08:15:00"}]},
}


def _plain(value: Any) -> bool:
    """Whether ``value`` is made of exactly the JSON types (no subclasses)."""
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)


# --------------------------------------------------------------------------- json_safe and Passage
def test_json_safe_converts_numpy_dates_and_paths():
    out = json_safe(RAW)
    assert out == CONVERTED and _plain(out)
    assert json.loads(json.dumps(out)) == CONVERTED
    assert json_safe(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert json_safe(np.array(3.0)) == 3.0 and type(json_safe(np.str_("x"))) is str


@pytest.mark.parametrize(
    ("metadata", "named"),
    [
        ({"blob": b"x"}, r"metadata\['blob'\] is a builtins.bytes"),
        ({"tags": {"a", "b"}}, r"metadata\['tags'\] is a builtins.set"),
        ({"z": 1j}, r"metadata\['z'\] is a builtins.complex"),
        ({"list": [1, object()]}, r"metadata\['list'\]\[1\] is a builtins.object"),
        ({"map": {1: "one"}}, r"metadata\['map'\] has a key 1 of type int"),
        ({"delta": dt.timedelta(days=1)}, r"metadata\['delta'\] is a datetime.timedelta"),
    ],
)
def test_passage_refuses_what_cannot_be_json_naming_the_key(metadata, named):
    with pytest.raises(ValueError, match=r"Passage 'p1': " + named):
        Passage(id="p1", text="x", metadata=metadata)


def test_cycles_depth_and_non_dict_metadata_are_value_errors():
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="contains itself"):
        Passage(id="p", text="x", metadata=loop)
    deep: Any = 1
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        Passage(id="p", text="x", metadata={"d": deep})
    with pytest.raises(ValueError, match="metadata must be a dict"):
        Passage(id="p", text="x", metadata=[("a", 1)])  # type: ignore[arg-type]


def test_passage_metadata_is_converted_once_and_survives_chunking_and_to_dict():
    passage = Passage(id="p", text=TEXT, metadata=RAW)
    assert passage.metadata == CONVERTED and _plain(passage.metadata)
    assert Passage.from_dict(json.loads(json.dumps(passage.to_dict()))) == passage
    chunks = chunk_passages([passage], max_words=5)
    assert len(chunks) > 1 and all(c.metadata == CONVERTED for c in chunks)


# --------------------------------------------------------------------------- output contract
def test_output_contract_carries_converted_metadata(tiny_lm):
    passage = Passage(id="curie", title="Marie Curie", text=TEXT, metadata=RAW)
    decoder = NestDecoder(tiny_lm, TokenDatastore([passage], PassageEncoder(tiny_lm)))
    out = decoder.generate("Marie Curie", passages=[(passage, 1.0)], use_chat_template=False, **COPY)
    assert out.sources, "retrieval dominates the random LM: the passage is copied"
    contract = json.loads(json.dumps(out.to_dict(), allow_nan=False))
    assert contract["sources"][0]["metadata"] == CONVERTED
    assert all(s["source"]["metadata"] == CONVERTED for s in contract["spans"] if s["copied"])


# --------------------------------------------------------------------------- LangChain
def test_langchain_chat_and_llm_responses_serialise_numpy_metadata(tiny_lm):
    pytest.importorskip("langchain_core")
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from nest_integrations.langchain import ChatNest, NestLLM

    class Fixed(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            return [Document(id="curie", page_content=TEXT, metadata={"title": "Marie Curie", **RAW})]

    expected = {"title": "Marie Curie", **CONVERTED}
    chat = ChatNest.from_lm(tiny_lm, retriever=Fixed(), **COPY)
    message = chat.invoke("Marie Curie")
    assert json.loads(message.model_dump_json())["response_metadata"]["sources"][0]["metadata"] == expected
    llm = NestLLM.from_lm(tiny_lm, retriever=Fixed(), **COPY)
    result = llm.generate(["Marie Curie"])
    info = result.generations[0][0].generation_info
    assert json.loads(json.dumps(info))["sources"][0]["metadata"] == expected
    result.model_dump_json()


def test_langchain_store_refuses_bad_metadata_when_added():
    pytest.importorskip("langchain_core")
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from nest_integrations.langchain import NestVectorStore

    store = NestVectorStore(DeterministicFakeEmbedding(size=8))
    with pytest.raises(ValueError, match=r"metadatas\[1\]\['blob'\] is a builtins.bytes"):
        store.add_texts(["a", "b"], metadatas=[{"ok": np.float32(1)}, {"blob": b"x"}], ids=["a", "b"])
    assert len(store) == 0
    store.add_texts(["a"], metadatas=[{"ok": np.float32(1)}], ids=["a"])
    assert len(store) == 1


# --------------------------------------------------------------------------- LlamaIndex
def _node(node_id: str, embedding: Any, **metadata: Any) -> Any:
    from llama_index.core.schema import TextNode

    return TextNode(id_=node_id, text=TEXT, embedding=embedding, metadata=metadata)


def test_llama_index_llm_response_serialises_numpy_metadata(tiny_lm):
    pytest.importorskip("llama_index.core")
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore

    from nest_integrations.llama_index import NestLLM

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle: Any) -> list[NodeWithScore]:
            return [NodeWithScore(node=_node("curie", None, title="Marie Curie", **RAW), score=1.0)]

    llm = NestLLM(tiny_lm, retriever=Fixed(), config=COPY)
    response = llm.complete("Marie Curie")
    contract = json.loads(json.dumps(response.additional_kwargs["nest"], allow_nan=False))
    assert contract["sources"][0]["metadata"] == {"title": "Marie Curie", **CONVERTED}
    response.model_dump_json()


@pytest.mark.parametrize(
    ("embedding", "message"),
    [
        ([], "node 'bad' has an empty embedding"),
        ([1.0, float("nan")], "node 'bad' has an embedding with NaN or infinite values"),
        ([float("inf"), 0.0], "node 'bad' has an embedding with NaN or infinite values"),
        ([-float("inf"), 0.0], "node 'bad' has an embedding with NaN or infinite values"),
    ],
)
def test_llama_index_store_refuses_empty_nan_and_inf_embeddings(embedding, message):
    pytest.importorskip("llama_index.core")
    from nest_integrations.llama_index import NestVectorStore

    store = NestVectorStore()
    with pytest.raises(ValueError, match=message):
        store.add([_node("ok", [1.0, 0.0]), _node("bad", embedding)])
    assert store.get_nodes() == []  # all or nothing


def test_llama_index_store_refuses_bad_metadata_naming_the_node():
    pytest.importorskip("llama_index.core")
    from nest_integrations.llama_index import NestVectorStore

    store = NestVectorStore()
    with pytest.raises(ValueError, match=r"Passage 'bad': metadata\['blob'\] is a builtins.bytes"):
        store.add([_node("ok", [1.0, 0.0], score=np.float32(1)), _node("bad", [0.0, 1.0], blob=b"x")])
    assert store.get_nodes() == []


def test_numpy_and_date_metadata_survive_a_langchain_save(tmp_path):
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from nest_integrations.langchain import NestVectorStore

    store = NestVectorStore(DeterministicFakeEmbedding(size=8))
    store.add_texts(["a text"], [{"score": np.float32(0.5), "n": np.int64(3), "day": dt.date(2020, 1, 2)}], ids=["a"])
    store.save_local(tmp_path / "store")
    loaded = NestVectorStore.load_local(tmp_path / "store", DeterministicFakeEmbedding(size=8))
    assert loaded.get_by_ids(["a"])[0].metadata == {"score": 0.5, "n": 3, "day": "2020-01-02"}
