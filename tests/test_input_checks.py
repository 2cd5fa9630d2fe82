"""Bad inputs give a ValueError (or TypeError for a wrong type) naming the field; the context
bounds the generation; score() computes p_M chunk by chunk."""

from __future__ import annotations

import math
import re

import pytest
import torch

from conftest import make_tiny_lm

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.decoder import NestDecoder, check_prompt
from nest_integrations.decoding.mixing import Mixer
from nest_integrations.decoding.scoring import SCORE_CHUNK
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

BASE = dict(mode="base", max_new_tokens=2)
COPY = dict(alpha=5.0, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0)
LONG = "The committee met again on Tuesday to discuss the harbour, the budget and the new school. " * 4


@pytest.fixture(scope="module")
def decoder(tiny_lm) -> NestDecoder:
    return NestDecoder(tiny_lm)


# --------------------------------------------------------------------------- NestConfig
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alpha", math.nan),
        ("alpha", math.inf),
        ("alpha", -math.inf),
        ("tau", math.nan),
        ("tau", math.inf),
        ("gamma", math.nan),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("seed", 2**70),
        ("seed", 2**64),
        ("seed", -1),
        ("stop", [""]),
        ("stop", ["END", ""]),
    ],
)
def test_config_refuses_non_finite_seeds_out_of_range_and_empty_stops(field, value):
    with pytest.raises(ValueError, match=field):
        NestConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        NestConfig().updated(**{field: value})


def test_config_keeps_its_defaults_and_accepts_the_edges():
    assert NestConfig() == NestConfig.model_validate(NestConfig().model_dump())
    config = NestConfig(seed=2**64 - 1, stop=["\n\n"], alpha=-2.0, temperature=0.0)
    assert config.seed == 2**64 - 1 and config.stop == ["\n\n"]
    torch.Generator().manual_seed(config.seed)  # what the sampler does with it


def test_largest_seed_samples(decoder):
    out = decoder.generate("Hello", mode="base", max_new_tokens=3, do_sample=True, seed=2**64 - 1)
    assert out.stats.new_tokens >= 1


# --------------------------------------------------------------------------- prompts and messages
def test_generate_batch_refuses_a_string(decoder):
    with pytest.raises(TypeError, match="prompts must be a list of prompts"):
        decoder.generate_batch("abc", **BASE)
    with pytest.raises(TypeError, match=r"prompts\[1\]: the prompt must be a string"):
        decoder.generate_batch(["fine", 5], **BASE)
    with pytest.raises(ValueError, match=r"prompts\[0\]: message 1 needs a string 'content'"):
        decoder.generate_batch([[{"role": "user", "content": "a"}, {"role": "user"}]], **BASE)
    with pytest.raises(ValueError, match="2 prompts but a string"):
        decoder.generate_batch(["a", "b"], queries="ab", **BASE)  # type: ignore[arg-type]
    assert len(decoder.generate_batch(("a", "b"), **BASE)) == 2


@pytest.mark.parametrize(
    ("prompt", "error", "named"),
    [
        ("caf\ud800e", ValueError, r"the prompt holds a lone surrogate \('\\ud800' at character 3\)"),
        ([{"role": "user", "content": "x\udfff"}], ValueError, "message 0 content holds a lone surrogate"),
        ([{"role": "user", "content": "hi"}, "hello"], ValueError, "message 1 must be a"),
        ([{"role": "user", "content": "hi"}, None], ValueError, "message 1 must be a"),
        ([{"content": "hi"}], ValueError, "message 0 needs a non-empty string 'role'"),
        ([{"role": "", "content": "hi"}], ValueError, "message 0 needs a non-empty string 'role'"),
        ([{"role": 3, "content": "hi"}], ValueError, "message 0 needs a non-empty string 'role'"),
        ([{"role": "user"}], ValueError, "message 0 needs a string 'content'"),
        ([{"role": "user", "content": ["a"]}], ValueError, "message 0 needs a string 'content'"),
        ([], ValueError, "no messages"),
        ({"role": "user", "content": "hi"}, TypeError, "got dict"),
        (b"hello", TypeError, "got bytes"),
        (42, TypeError, "got int"),
    ],
)
def test_malformed_prompts_name_what_is_wrong(decoder, prompt, error, named):
    with pytest.raises(error, match=named):
        check_prompt(prompt)
    with pytest.raises(error, match=named):
        decoder.generate(prompt, **BASE)
    with pytest.raises(error, match=named):
        decoder.score(prompt, " text", mode="base")


def test_surrogates_in_the_system_prompt_and_continuation(decoder):
    with pytest.raises(ValueError, match="system_prompt holds a lone surrogate"):
        decoder.generate("hi", system_prompt="be \ud83d brief", **BASE)
    with pytest.raises(ValueError, match="continuation holds a lone surrogate"):
        decoder.score("hi", " x\ud800", mode="base")
    with pytest.raises(TypeError, match="continuation must be a string"):
        decoder.score("hi", 5, mode="base")  # type: ignore[arg-type]
    assert decoder.generate("caf\u00e9 \U0001f600", **BASE).stats.new_tokens >= 1  # paired surrogates are fine


# --------------------------------------------------------------------------- the context
def test_max_new_tokens_beyond_the_context_is_an_error(decoder, tiny_lm):
    context = tiny_lm.context_length
    for too_many in (context, context + 100, context - NestDecoder.MIN_PROMPT_TOKENS + 1):
        with pytest.raises(ValueError, match=rf"max_new_tokens={too_many} does not fit the model's context of {context}"):
            decoder.generate(LONG, mode="base", use_chat_template=False, max_new_tokens=too_many)
    # a 1-token prompt may take everything else
    ok = decoder.encode_prompt("", NestConfig(max_new_tokens=context - 1), decoder.generate("", **BASE).stats)
    assert len(ok) == 1


@pytest.fixture(scope="module")
def short_context(smol_tokenizer) -> NestDecoder:
    """A decoder over a tiny LM that claims a 64-token context (its own, so the shared one is untouched)."""
    lm = make_tiny_lm(smol_tokenizer, seed=1)
    lm.model.config.max_position_embeddings = 64
    return NestDecoder(lm)


def test_a_long_prompt_is_cut_to_what_the_context_leaves_and_generation_stops_inside_it(short_context):
    context = short_context.lm.context_length
    budget = context - NestDecoder.MIN_PROMPT_TOKENS
    out = short_context.generate(
        LONG, mode="base", use_chat_template=False, max_new_tokens=budget, do_sample=True, seed=0, temperature=50.0
    )
    assert out.stats.prompt_truncated and out.stats.prompt_tokens == NestDecoder.MIN_PROMPT_TOKENS
    assert out.stats.prompt_tokens + out.stats.new_tokens <= context
    # max_prompt_tokens never lets prompt plus max_new_tokens exceed the context
    out = short_context.generate(LONG, mode="base", use_chat_template=False, max_new_tokens=40, max_prompt_tokens=30)
    assert out.stats.prompt_tokens == context - 40
    with pytest.raises(ValueError, match=r"use max_new_tokens <= 48"):
        short_context.generate(LONG, mode="base", use_chat_template=False, max_new_tokens=49)


def test_score_keeps_a_minimum_prompt_whatever_max_new_tokens(decoder, tiny_lm):
    scored = decoder.score(LONG, " and the harbour", mode="base", max_new_tokens=tiny_lm.context_length)
    assert len(scored.token_ids) >= 1 and torch.isfinite(scored.logp_lm).all()


# --------------------------------------------------------------------------- chunked score
@pytest.fixture(scope="module")
def nest_decoder(tiny_lm) -> tuple[NestDecoder, list[tuple[Passage, float]]]:
    passages = [
        Passage(id="a", title="Harbour", text=LONG),
        Passage(id="b", title="School", text="The new school opened in September with four hundred pupils."),
    ]
    return NestDecoder(tiny_lm, TokenDatastore(passages, PassageEncoder(tiny_lm))), [(p, 1.0) for p in passages]


@pytest.mark.parametrize("mode", ["base", "knnlm", "nest"])
def test_chunked_score_equals_unchunked(nest_decoder, mode):
    decoder, hits = nest_decoder
    continuation = LONG[:300]
    kwargs = dict(passages=hits, mode=mode, use_chat_template=False, **COPY)
    whole = decoder.score("Minutes:", continuation, **kwargs)
    assert len(whole.token_ids) < SCORE_CHUNK  # one chunk
    chunked_decoder = NestDecoder(decoder.lm, decoder.datastore)
    chunked_decoder.scorer.chunk = 7
    chunked = chunked_decoder.score("Minutes:", continuation, **kwargs)
    assert chunked.token_ids == whole.token_ids
    for name in ("logp_lm", "lam", "ratio"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name), rtol=1e-5, atol=1e-5)
    # The kNN distances are float32 products whose rounding depends on how many query rows they
    # get (BLAS picks kernels by shape; d_min / d_max moves by ~3e-7 between chunks of 7 and 61 on
    # some CPUs), and the kNN softmax's temperature amplifies that in log p_M (up to 4e-5 seen).
    torch.testing.assert_close(chunked.logp_mixture, whole.logp_mixture, rtol=1e-4, atol=1e-4)
    # the chunked LM head reproduces the model's own logits
    assert decoder.scorer.head_reproduces_logits()
    full_logits = NestDecoder(decoder.lm, decoder.datastore)
    full_logits.scorer._head_ok = False
    reference = full_logits.score("Minutes:", continuation, **kwargs)
    for name in ("logp_mixture", "logp_lm", "lam"):
        torch.testing.assert_close(getattr(reference, name), getattr(whole, name), rtol=1e-4, atol=1e-4)
    if mode != "base":
        assert (whole.lam < 1).any(), "the datastore took part"


def test_score_never_holds_a_whole_logit_matrix(nest_decoder, monkeypatch):
    decoder, hits = nest_decoder
    chunked = NestDecoder(decoder.lm, decoder.datastore)
    chunked.scorer.chunk = 16
    widest: list[int] = []
    original = Mixer.mixture

    def spy(self, logits, queries, gen):
        widest.append(logits.shape[0])
        return original(self, logits, queries, gen)

    monkeypatch.setattr(Mixer, "mixture", spy)
    scored = chunked.score("Minutes:", LONG, passages=hits, use_chat_template=False, **COPY)
    assert len(scored.token_ids) > 64 and max(widest) == 16


# --------------------------------------------------------------------------- CLI: every option checked before work
@pytest.fixture
def no_work(monkeypatch, tiny_lm, tmp_path):
    """The CLI with the tiny LM, where embedding passages or loading an index is an error: a command
    refused by these tests must refuse before either. Returns a corpus of three passages."""
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.retrieval.dense import DenseRetriever

    def work(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    monkeypatch.setattr(DenseRetriever, "__init__", work)
    monkeypatch.setattr(NestIndex, "load", work)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "p{i}", "text": "Passage number {i} is short."}}\n' for i in range(3)))
    return corpus


@pytest.mark.parametrize(("options", "message"), [
    (["--workers", "-2"], "Invalid value for '--workers'"),
    (["--workers", "2"], "--workers apply with --ray only"),
    (["--shard-passages", "0"], "Invalid value for '--shard-passages'"),
    (["--shard-passages", "64", "--ray-timeout", "3"], "--shard-passages, --ray-timeout apply with --ray only"),
    (["--ray", "--cpus-per-worker", "0"], "Invalid value for '--cpus-per-worker'"),
    (["--ray", "--nlist", "2"], "--ray builds take --faiss-index only; --nlist apply to local builds"),
    (["--ray", "--lazy-keys"], "--ray builds precomputed keys"),
    (["--faiss-index", "ivf", "--nlist", "50"], r"nlist must be an integer in \[1, 3\]"),
    (["--key-compression", "pq7"], "key_codec 'pq7' \\(CLI: --key-compression\\): .*divides the key width 64"),
    (["--key-compression", "spq1"], "key_codec 'spq1' \\(CLI: --key-compression\\)"),
    (["--key-compression", "pq8", "--lazy-keys"], "--key-compression stores precomputed keys"),
    (["--max-words", "5", "--max-tokens", "20"], "--max-words and --max-tokens"),
])
def test_index_build_refuses_bad_options_before_embedding(no_work, tmp_path, options, message):
    from typer.testing import CliRunner

    from nest_integrations.cli import app

    result = CliRunner().invoke(app, ["index", "build", str(no_work), "--out", str(tmp_path / "index"), *options])
    assert result.exit_code == 2, (result.output, result.exception)
    assert re.search(message, " ".join(result.output.split()))
    assert not (tmp_path / "index").exists()


@pytest.mark.parametrize(("options", "message"), [
    (["hi", "--workers", "2"], "--workers apply with --ray only"),
    (["hi", "--ray-timeout", "5"], "--ray-timeout apply with --ray only"),
    (["hi", "--restart"], "--restart apply with --input only"),
    (["hi", "--output", "out.jsonl"], "--output apply with --input only"),
    (["hi", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    (["hi", "--max-new-tokens", "0"], "Invalid value for '--max-new-tokens'"),
    (["hi", "--ray"], "--ray needs --input"),
    (["--input", "{items}", "--output", "{out}", "--query", "q"], "--query apply to one PROMPT"),
    (["--input", "{items}", "--output", "{out}", "--ray", "--cpus-per-worker", "-1"], "Invalid value for '--cpus-per-worker'"),
    (["--input", "{bad}", "--output", "{out}"], "bad.jsonl:2: invalid JSON"),
    (["--input", "{items}", "--output", "{notes}"], "is not the output of a generation job; not touching it"),
    (["--input", "{items}", "--output", "{notes}", "--restart"], "is not the output of a generation job; not touching it"),
])
def test_generate_refuses_bad_options_before_loading_anything(no_work, tmp_path, options, message):
    from typer.testing import CliRunner

    from nest_integrations.cli import app

    files = {"items": tmp_path / "items.jsonl", "bad": tmp_path / "bad.jsonl", "out": tmp_path / "out.jsonl", "notes": tmp_path / "notes.txt"}
    files["items"].write_text('{"prompt": "Who?"}\n')
    files["bad"].write_text('{"prompt": "Who?"}\n{"prompt": \n')
    files["notes"].write_text("my notes\n")
    args = [a.format(**files) for a in options]
    result = CliRunner().invoke(app, ["generate", "-d", str(tmp_path / "index"), *args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert message in " ".join(result.output.split())
    assert files["notes"].read_text() == "my notes\n" and not files["out"].exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--task", "bios"], "unknown --task 'bios'"),
    (["--modes", "nest,fast"], "--modes takes some of base, rag, knnlm, nest, ra_nest"),
    (["--modes", ""], "--modes takes some of"),
    (["--n", "0"], "Invalid value for '--n'"),
    (["--max-new-tokens", "0"], "Invalid value for '--max-new-tokens'"),
    (["--codec-sample", "0"], "Invalid value for '--codec-sample'"),
    (["--task", "qa"], "--task qa needs --qa FILE"),
    (["--key-compression", "pq"], "--key-compression:"),
    (["--task", "docs", "--docs-chunking", "sentence"], "unknown --docs-chunking 'sentence' for docs"),
])
def test_eval_refuses_bad_options_before_loading_anything(no_work, tmp_path, options, message):
    from typer.testing import CliRunner

    from nest_integrations.cli import app

    result = CliRunner().invoke(app, ["eval", "-d", str(tmp_path / "index"), "--out", str(tmp_path / "out"), *options])
    assert result.exit_code == 2, (result.output, result.exception)
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()
