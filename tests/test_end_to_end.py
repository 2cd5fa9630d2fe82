"""End to end with the real default model (SmolLM2-135M-Instruct) on a handful of summaries."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_integrations.corpus.passages import save_passages_jsonl
from nest_integrations.index.nest_index import NestIndex
from nest_integrations.model.lm import load_lm

pytestmark = pytest.mark.slow

NAMES = ["Marie Curie", "Albert Einstein", "Isaac Newton", "Charles Darwin", "Pierre Curie", "Niels Bohr"]


@pytest.fixture(scope="module")
def real_index():
    by_title = {p.id: p for p in load_wikipedia_summaries()}
    passages = [by_title[n] for n in NAMES]
    return NestIndex.build(passages, load_lm(), show_progress=False)


def test_nest_copies_the_right_biography_verbatim_and_fast(real_index):
    decoder = real_index.decoder()
    out = decoder.generate("Tell me a bio of Marie Curie.", query="Marie Curie", max_new_tokens=64)
    assert out.attribution_ratio >= 0.5
    assert out.sources[0].id == "Marie Curie"
    by_id = {p.id: p for p in real_index.passages}
    for span in out.copied_spans:
        assert by_id[span.source.id].text[span.source.chunk_char_start : span.source.chunk_char_end] == span.text
    assert out.stats.forward_passes * 3 < out.stats.new_tokens


def test_nest_falls_back_to_the_lm_when_the_corpus_lacks_the_person(real_index):
    decoder = real_index.decoder()
    hits = real_index.retrieve("Marie Curie", 5, exclude_ids=["Marie Curie"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = decoder.generate("Tell me a bio of Marie Curie.", query="Marie Curie", passages=hits, max_new_tokens=48)
    assert out.attribution_ratio < 0.3


def test_a_batch_decodes_as_each_prompt_alone(real_index):
    """Copying rows, a question and a row the corpus cannot answer share forwards on the
    default model; each keeps the text, spans and sources it has alone."""
    decoder = real_index.decoder()
    prompts = ["Tell me a bio of Marie Curie.", "Who was Niels Bohr?", "Tell me a bio of Isaac Newton.",
               "What is the boiling point of water at sea level?"]
    queries = ["Marie Curie", None, "Isaac Newton", None]
    batched = decoder.generate_batch(prompts, queries=queries, max_batch=4, max_new_tokens=32)
    decoder.shares_batches = False  # each prompt alone, in its own KV cache
    try:
        alone = [decoder.generate(p, query=q, max_new_tokens=32) for p, q in zip(prompts, queries)]
    finally:
        decoder.shares_batches = True
    assert [o.text for o in batched] == [o.text for o in alone]
    assert [o.spans for o in batched] == [o.spans for o in alone]
    assert [[s.id for s in o.sources] for o in batched] == [[s.id for s in o.sources] for o in alone]
    assert [o.stats.forward_passes for o in batched] == [o.stats.forward_passes for o in alone]
    assert batched[0].attribution_ratio >= 0.5 and batched[3].attribution_ratio < 0.3


def test_cli_build_retrieve_generate(tmp_path):
    by_title = {p.id: p for p in load_wikipedia_summaries()}
    source = tmp_path / "docs.jsonl"
    save_passages_jsonl([by_title[n] for n in NAMES], source)
    out_dir = tmp_path / "idx"
    runner = CliRunner()
    result = runner.invoke(app, ["index", "build", str(source), "--out", str(out_dir), "--precompute-keys"])
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output
    result = runner.invoke(app, ["retrieve", str(out_dir), "Marie Curie", "--k", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[0])["id"] == "Marie Curie"
    result = runner.invoke(app, ["retrieve", str(out_dir), "Marie Curie", "--k", "2"])
    assert result.exit_code == 0 and "Marie" in result.output
    result = runner.invoke(app, ["generate", "-d", str(out_dir), "Tell me a bio of Isaac Newton.", "--query", "Isaac Newton", "--json", "--max-new-tokens", "24"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["mode"] == "nest" and payload["stats"]["new_tokens"] == 24
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "a", "prompt": "Tell me a bio of Niels Bohr.", "query": "Niels Bohr"}) + "\n")
    result = runner.invoke(app, ["generate", "-d", str(out_dir), "--input", str(items), "--output", str(tmp_path / "out.jsonl"), "--max-new-tokens", "16"])
    assert result.exit_code == 0, result.output
    line = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert line["id"] == "a" and "spans" in line
    result = runner.invoke(app, ["generate", "-d", str(out_dir), "hi", "--mode", "teleport"])
    assert result.exit_code == 2 and "unknown mode" in result.output
