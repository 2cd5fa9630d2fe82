"""Foreign vector stores as NEST's first stage: Qdrant local mode through
langchain-qdrant, and a LlamaIndex SimpleVectorStore.

The tiny random Llama of conftest.py decodes with knobs where retrieval
dominates (as in test_langchain.py), so spans are copied from what the store
returned and the test can follow each span back to the store's document.
"""

from __future__ import annotations

import pytest

from nest_integrations import store_decoder
from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.langchain import LangChainVectorStoreRetriever, open_qdrant, write_qdrant
from nest_integrations.langchain.qdrant import qdrant_point_id
from nest_integrations.retrieval import PassageRetriever

pytest.importorskip("langchain_qdrant")

KNOBS = dict(alpha=5.0, delta=1.0, gamma=1e-6, max_new_tokens=12, min_passage_relevance=-1.0)


@pytest.fixture(scope="module")
def embeddings():
    from nest_integrations.langchain import default_embeddings

    return default_embeddings()


@pytest.fixture
def chunked(small_passages) -> list[Passage]:
    """The small corpus plus Curie's biography cut into two chained chunks of one document."""
    text = small_passages[0].text
    cut = text.index(" She was born")
    chunks = [
        Passage(id="curie-0", text=text[:cut], title="Marie Curie", doc_id="curie-doc", doc_char_start=0),
        Passage(id="curie-1", text=text[cut:], title="Marie Curie", doc_id="curie-doc", doc_char_start=cut),
    ]
    return [*small_passages[1:], *chunks]


@pytest.fixture
def qdrant(tmp_path, chunked, embeddings):
    write_qdrant(chunked, tmp_path / "qdrant", "people", embeddings)
    store = open_qdrant(tmp_path / "qdrant", "people", embeddings)
    yield store
    store.client.close()


def test_qdrant_documents_map_to_passages(qdrant, chunked):
    retriever = LangChainVectorStoreRetriever(qdrant)
    assert isinstance(retriever, PassageRetriever) and retriever.relevance is not None
    hits = retriever.retrieve("Alan Turing, the English mathematician", 2)
    assert len(hits) == 2
    top, score = hits[0]
    turing = next(p for p in chunked if p.id == "turing")
    assert top.id == qdrant_point_id("turing") and top.text == turing.text and top.title == "Alan Turing"
    assert top.metadata["passage_id"] == "turing" and 0 < score <= 1
    by_name = {p.metadata["passage_id"]: p for p, _ in retriever.retrieve("Marie Curie", 4)}
    assert (by_name["curie-1"].doc_id, by_name["curie-1"].doc_char_start) == ("curie-doc", chunked[-1].doc_char_start)
    assert retriever.retrieve("   ", 3) == []
    with pytest.raises(ValueError, match="positive integer"):
        retriever.retrieve("Turing", 0)


def test_qdrant_first_stage_drives_nest_with_attribution(qdrant, tiny_lm):
    retriever = LangChainVectorStoreRetriever(qdrant)
    decoder = store_decoder(retriever, tiny_lm, NestConfig(**KNOBS))
    assert decoder.datastore is not None and not decoder.datastore.passages  # nothing encoded before retrieval
    output = decoder.generate("Tell me about Marie Curie.", query="Marie Curie")
    copied = [span for span in output.spans if span.copied]
    assert copied and output.stats.encoded_passages > 0
    stored = {p.id: p for p, _ in retriever.retrieve("Marie Curie", 8)}
    for span in copied:
        passage = stored[span.source.id]  # every source is a Qdrant point the store returned
        assert passage.text[span.source.chunk_char_start : span.source.chunk_char_end] == span.text
        assert span.source.metadata["passage_id"] == passage.metadata["passage_id"]


def test_qdrant_refusals(tmp_path, chunked, embeddings, qdrant):
    folder = tmp_path / "other"
    assert write_qdrant(chunked, folder, "people", embeddings) == len(chunked)
    with pytest.raises(ValueError, match="already has a Qdrant collection 'people'"):
        write_qdrant(chunked[:1], folder, "people", embeddings)
    with pytest.raises(ValueError, match="no Qdrant collection 'nope'; it has \\['people'\\]"):
        open_qdrant(folder, "nope", embeddings)
    kept = open_qdrant(folder, "people", embeddings)  # the refused write lost nothing
    assert kept.client.count("people").count == len(chunked)
    kept.client.close()
    assert write_qdrant(chunked[:1], folder, "people", embeddings, overwrite=True) == 1
    with pytest.raises(ValueError, match="not a local Qdrant folder"):
        open_qdrant(tmp_path / "missing", "people", embeddings)
    with pytest.raises(ValueError, match="no passages"):
        write_qdrant([], tmp_path / "empty", "people", embeddings)
    with pytest.raises(ValueError, match="VectorStore or BaseRetriever"):
        LangChainVectorStoreRetriever(object())


def test_llama_index_vector_store_first_stage(small_passages, tiny_lm):
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from nest_integrations.llama_index import LlamaIndexVectorStoreRetriever, default_embed_model

    embed = default_embed_model()
    nodes = [TextNode(id_=p.id, text=p.text, metadata={"title": p.title}) for p in small_passages]
    index = VectorStoreIndex(nodes, embed_model=embed)
    with pytest.raises(ValueError, match="keeps no text.*pass the VectorStoreIndex"):
        LlamaIndexVectorStoreRetriever(index.vector_store, embed_model=embed)
    retriever = LlamaIndexVectorStoreRetriever(index)
    assert [p.id for p, _ in retriever.retrieve("Alan Turing", 1)] == ["turing"]
    assert retriever.relevance("Alan Turing", [p.text for p in small_passages])[1] > 0.5
    output = store_decoder(retriever, tiny_lm, NestConfig(**KNOBS)).generate("Who was Alan Turing?", query="Alan Turing")
    texts = {p.id: p.text for p in small_passages}
    copied = [span for span in output.spans if span.copied]
    assert copied
    for span in copied:
        assert texts[span.source.id][span.source.chunk_char_start : span.source.chunk_char_end] == span.text
    with pytest.raises(ValueError, match="BasePydanticVectorStore or VectorStoreIndex"):
        LlamaIndexVectorStoreRetriever(object())


def test_qdrant_of_another_dimension_or_unreadable_is_a_value_error_that_deletes_nothing(tmp_path, chunked, embeddings):
    from langchain_core.embeddings import DeterministicFakeEmbedding

    folder = tmp_path / "small"
    write_qdrant(chunked, folder, "people", DeterministicFakeEmbedding(size=8))
    with pytest.raises(ValueError, match=r"'people' in .*small holds 8-d vectors, the embeddings give 384-d") as refused:
        open_qdrant(folder, "people", embeddings)
    assert "force_recreate" not in str(refused.value) and "embeddings that wrote it" in str(refused.value)
    kept = open_qdrant(folder, "people", DeterministicFakeEmbedding(size=8))  # the folder is not locked, nor changed
    assert kept.client.count("people").count == len(chunked)
    kept.client.close()

    for damaged, data in (("collection/people/storage.sqlite", b"\0garbage" * 64), ("meta.json", b"{not json")):
        broken = tmp_path / f"broken-{damaged.split('/')[-1]}"
        write_qdrant(chunked, broken, "people", DeterministicFakeEmbedding(size=8))
        (broken / damaged).write_bytes(data)
        for attempt in (lambda: open_qdrant(broken, "people", embeddings),
                        lambda: write_qdrant(chunked, broken, "people", embeddings, overwrite=True)):
            with pytest.raises(ValueError, match=r"broken-.*: the local Qdrant storage cannot be read .*Nothing was changed"):
                attempt()
        assert (broken / damaged).read_bytes() == data
