"""The bundled MiniLM run through transformers alone embeds and retrieves as sentence-transformers does.

``make test`` checks a small sample of the bundled People summaries; for the fuller check, run
by hand ``NEST_EMBEDDER_CHECK_PASSAGES=400 OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -s
tests/test_sentence_encoder.py`` (the figures it prints are in docs/serving.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_integrations.retrieval import DenseRetriever, default_embedder_path, load_embedder
from nest_integrations.retrieval.base import index_text
from nest_integrations.retrieval.dense import embed_texts
from nest_integrations.retrieval.sentence_encoder import TransformerSentenceEmbedder, plain_sentence_model

PASSAGES = int(os.environ.get("NEST_EMBEDDER_CHECK_PASSAGES", "48"))
TOLERANCE = 1e-5
"""Max abs difference allowed between the two embeddings of a text."""


@pytest.fixture(scope="module")
def passages():
    return load_wikipedia_summaries("People", limit=PASSAGES)


@pytest.fixture(scope="module")
def both():
    """(transformers-run, sentence-transformers) embedders of the bundled MiniLM."""
    from sentence_transformers import SentenceTransformer

    return load_embedder(), SentenceTransformer(default_embedder_path(), device="cpu")


def test_the_bundled_minilm_is_a_plain_pipeline_loaded_without_sentence_transformers():
    spec = plain_sentence_model(default_embedder_path())
    assert spec is not None and (spec.pooling, spec.normalize, spec.max_seq_length) == ("mean", True, 256)
    code = (
        "import sys; from nest_integrations.retrieval import load_embedder; e = load_embedder(); e.encode(['x']); "
        "print(type(e).__name__, 'sentence_transformers' in sys.modules, 'sklearn' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["TransformerSentenceEmbedder", "False", "False"]


def test_embeddings_and_retrieval_equal_sentence_transformers(both, passages):
    light, reference = both
    assert isinstance(light, TransformerSentenceEmbedder)
    texts = [index_text(p) for p in passages]
    ours, theirs = embed_texts(light, texts), embed_texts(reference, texts)
    difference = float(np.abs(ours - theirs).max())
    queries = [p.title for p in passages] + [f"Who was {p.title}?" for p in passages[::3]] + [
        "a physicist who won the Nobel Prize", "a composer of operas", "an explorer of Africa", "a painter of the Renaissance",
    ]
    q_ours, q_theirs = embed_texts(light, queries), embed_texts(reference, queries)
    difference = max(difference, float(np.abs(q_ours - q_theirs).max()))
    k = 8
    top_ours = DenseRetriever.from_vectors(passages, ours, light).retrieve_batch(queries, k)
    top_theirs = DenseRetriever.from_vectors(passages, theirs, reference).retrieve_batch(queries, k)
    same = sum([p.id for p, _ in a] == [p.id for p, _ in b] for a, b in zip(top_ours, top_theirs))
    print(f"\n{len(texts)} passages, {len(queries)} queries: max abs difference {difference:.2e}, top-{k} ids equal for {same}/{len(queries)}")
    assert difference <= TOLERANCE
    assert same == len(queries)


@pytest.mark.parametrize(
    "change",
    [
        lambda f: _edit(f / "config_sentence_transformers.json", prompts={"query": "query: "}),
        lambda f: _edit(f / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False, pooling_mode_lasttoken=True),
        lambda f: _edit(f / "1_Pooling" / "config.json", pooling_mode_max_tokens=True),  # two poolings at once
        lambda f: _edit(f / "sentence_bert_config.json", do_lower_case=True),
        lambda f: _edit(f / "modules.json", value=json.loads((f / "modules.json").read_text())[:2]
                        + [{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]),
    ],
    ids=["prompt", "lasttoken", "two-poolings", "lower-case", "dense-layer"],
)
def test_other_pipelines_are_left_to_sentence_transformers(tmp_path, change):
    source = default_embedder_path()
    folder = tmp_path / "model"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "vocab.txt", "tokenizer.json"))
    assert plain_sentence_model(folder) is not None
    change(folder)
    assert plain_sentence_model(folder) is None
    assert plain_sentence_model("sentence-transformers/all-MiniLM-L6-v2") is None  # a hub name, not a folder


def _edit(path, value=None, **changes):
    data = value if value is not None else {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(data))


def test_threads_embedding_at_once_get_what_each_alone_gets(both, passages):
    from concurrent.futures import ThreadPoolExecutor

    light, _ = both
    texts = [[index_text(p)] + [p.title] * (i % 3 + 1) for i, p in enumerate(passages[:16])]
    alone = [light.encode(batch) for batch in texts]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(light.encode, texts))
    assert all(np.array_equal(a, b) for a, b in zip(alone, together))
