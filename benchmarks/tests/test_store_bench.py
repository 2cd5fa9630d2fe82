"""The store benchmark builds both quick starts' stores, reloads their keys memory-mapped and
times NEST against RAG question by question (tiny random Llama, two short Markdown files)."""

from __future__ import annotations

import json

import pytest
from conftest import make_tiny_lm

from nest_benchmarks.store_bench import run_store_bench
from nest_benchmarks.tasks import EvalItem

pytest.importorskip("langchain_text_splitters")
pytest.importorskip("llama_index.core")

DOCS = {
    "server.md": (
        "# Server\n\n## Options\n\nThe bodyLimit option sets the largest request body the server accepts; "
        "it defaults to 1048576 bytes.\n\n```js\nconst app = quill({ bodyLimit: 1048576 })\n```\n"
    ),
    "reply.md": (
        "# Reply\n\n<!-- metadata: not prose -->\n\n## Headers\n\nCall reply.header(name, value) to set a response "
        "header, and reply.removeHeader(name) to remove it again.\n"
    ),
}

ITEMS = [
    EvalItem(
        id="howto-body-limit", prompt="What is the largest request body the server accepts by default?",
        query="What is the largest request body the server accepts by default?", reference="",
        meta={"answers": ["1048576"], "kind": "howto", "unanswerable": False, "chat": True},
    ),
    EvalItem(
        id="followup-remove-header",
        prompt=[
            {"role": "user", "content": "How do I set a response header on a reply?"},
            {"role": "assistant", "content": "Call reply.header(name, value)."},
            {"role": "user", "content": "And how do I remove it again?"},
        ],
        query="How do I set a response header on a reply?\nAnd how do I remove it again?", reference="",
        meta={"answers": ["removeHeader"], "kind": "followup", "unanswerable": False, "chat": True},
    ),
    EvalItem(
        id="unanswerable-graphql", prompt="How do I add a GraphQL endpoint?", query="How do I add a GraphQL endpoint?",
        reference="", meta={"answers": [], "kind": "unanswerable", "unanswerable": True, "chat": True},
    ),
]


@pytest.fixture(scope="module")
def long_context_lm(smol_tokenizer):
    """The tiny Llama with room for LlamaIndex's RAG prompt (its 512 positions leave no
    room for the query engine's template: rotary positions go on past it)."""
    lm = make_tiny_lm(smol_tokenizer, seed=1)
    lm.model.config.max_position_embeddings = 2048
    return lm


@pytest.fixture(scope="module")
def bench(tmp_path_factory, long_context_lm):
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from llama_index.core.embeddings import MockEmbedding

    tmp_path = tmp_path_factory.mktemp("store-bench")
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    result = run_store_bench(
        out_dir=out, lm=long_context_lm, docs_dir=docs, items=ITEMS, max_new_tokens=6, chunk_size=120,
        embeddings=DeterministicFakeEmbedding(size=16), embed_model=MockEmbedding(embed_dim=16),
        store_dir=tmp_path / "stores", show_progress=False,
    )
    return result, out, tmp_path / "stores"


def test_both_integrations_answer_every_question_from_memory_mapped_keys(bench):
    result, out, stores = bench
    written = json.loads((out / "store_bench.json").read_text(encoding="utf-8"))
    assert written["integrations"].keys() == {"langchain", "llama_index"}
    assert written["rag_max_new_tokens"] == written["max_new_tokens"] == 6
    for name, summary in written["integrations"].items():
        assert (stores / name).is_dir(), "the store was saved before answering"
        assert summary["keys"]["memory_mapped"] and summary["keys"]["tokens"] > 0
        assert summary["build"]["chunks"] >= 2 and summary["build"]["encode_keys_s"] > 0
        assert summary["n"] == len(ITEMS)
        assert summary["wall_ratio"] > 0 and isinstance(summary["meets_goal"], bool)
        rows = written["questions"][name]
        assert [row["id"] for row in rows] == [item.id for item in ITEMS]
        for row in rows:
            for side in ("nest", "rag"):
                assert row[side]["wall_s"] > 0 and isinstance(row[side]["text"], str)
            assert row["nest"]["encoded_passages"] == 0, "no answer encodes keys: they were saved with the store"
            nest = row["nest"]
            split = ("retrieval_s", "encode_s", "decode_s", "other_decoder_s", "outside_decoder_s")
            assert sum(nest[key] for key in split) == pytest.approx(nest["wall_s"], abs=1e-3), "the time split adds up"
            assert row["wall_ratio"] == pytest.approx(row["nest"]["wall_s"] / row["rag"]["wall_s"])
        answerable = [row for row in rows if row["answers"]]
        assert all(row[side]["answer_recall"] in (0.0, 1.0) for row in answerable for side in ("nest", "rag"))
        unanswerable = next(row for row in rows if not row["answers"])
        assert unanswerable["nest"]["answer_recall"] is None and unanswerable["rag"]["answer_recall"] is None


def test_table_reports_each_integration_and_question(bench):
    _, out, _ = bench
    table = (out / "table.md").read_text(encoding="utf-8")
    assert "NEST / RAG wall" in table and "Where NEST's time goes" in table
    for name in ("langchain", "llama_index"):
        assert f"| {name} |" in table and f"## {name}: per question" in table
    assert all(f"| {item.id} |" in table for item in ITEMS)


def test_unknown_integration_is_refused(tmp_path, tiny_lm):
    with pytest.raises(ValueError, match="unknown integrations"):
        run_store_bench(out_dir=tmp_path, lm=tiny_lm, items=ITEMS, integrations=["haystack"])


def test_saved_store_is_reused_without_building(bench, long_context_lm, tmp_path):
    from langchain_core.embeddings import DeterministicFakeEmbedding

    _, out, stores = bench
    saved = sorted(p.name for p in (stores / "langchain").rglob("*"))
    result = run_store_bench(
        out_dir=tmp_path, lm=long_context_lm, docs_dir=out.parent / "docs", items=ITEMS[:1], max_new_tokens=4,
        integrations=["langchain"], embeddings=DeterministicFakeEmbedding(size=16), store_dir=stores,
        reuse_stores=True, show_progress=False,
    )
    summary = result["integrations"]["langchain"]
    assert summary["build"]["reused"] and "encode_keys_s" not in summary["build"]
    assert summary["keys"]["memory_mapped"] and summary["n"] == 1
    assert sorted(p.name for p in (stores / "langchain").rglob("*")) == saved, "the saved store is left as it was"
