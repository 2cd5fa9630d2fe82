"""The row scheduler (nest_integrations.batching): batched generation equals one-by-one generation."""

from __future__ import annotations

import pytest
import torch

from nest_integrations import batching
from nest_integrations.batching import _BatchCache, batched_generate, supports_batching
from nest_integrations.config import NestConfig
from nest_integrations.corpus import Passage
from nest_integrations.datastore import PassageEncoder, TokenDatastore
from nest_integrations.decoding import NestDecoder

COPY = dict(alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6)
# Short spans, strict acceptance, no source-end or answer stops: rows mix copies, rejections and LM
# tokens, feed drafts of different lengths into the same forward and finish after different numbers of steps.
MIXED = dict(gamma=0.9, alpha=0.3, tau=0.1, delta=0.5, span_length=5, stop_at_source_end=False, answer_focus=False, max_new_tokens=40)
UNIQUE = "Quixotic zebras juggle seventeen luminous marmalade jars beneath Harrogate."
KEEPER = " Their keeper, Ottoline Frump, counts every jar at dawn."
PROMPTS = [
    "Tell me about the comet catalogue.",
    "Who was Alan Turing?",
    "Quixotic zebras",
    "Write a long and winding account of radioactivity research in Warsaw, the physicists who worked on it, "
    "and what became of their notebooks after the war ended.",
    "Hi",
]


class ListRetriever:
    def __init__(self, passages):
        self.passages = list(passages)

    def retrieve(self, query, k):
        return [(p, 1.0) for p in self.passages][:k]


@pytest.fixture
def decoder(tiny_lm, small_passages):
    passages = small_passages + [
        Passage(id="d#0", title="Zebras", text=UNIQUE, doc_id="d"),
        Passage(id="d#1", title="Zebras", text=KEEPER, doc_id="d", doc_char_start=len(UNIQUE)),
    ]
    store = TokenDatastore(passages, PassageEncoder(tiny_lm))
    return NestDecoder(tiny_lm, store, ListRetriever(passages), NestConfig(max_new_tokens=24))


def _same(batched, single):
    assert len(batched) == len(single)
    for b, s in zip(batched, single):
        assert b.text == s.text
        assert b.spans == s.spans
        assert (b.attribution_ratio, b.mean_copied_span_tokens, b.sources) == (s.attribution_ratio, s.mean_copied_span_tokens, s.sources)
        assert b.stats.finish_reason == s.stats.finish_reason
        assert (b.stats.new_tokens, b.stats.forward_passes, b.stats.prompt_tokens) == (
            s.stats.new_tokens,
            s.stats.forward_passes,
            s.stats.prompt_tokens,
        )


def _count_decoding_forwards(decoder, calls):
    """Hook recording the rows of each decoding forward (those with a KV cache; datastore encoding has none)."""

    def record(module, args, kwargs, out):
        if kwargs.get(decoder._cache_arg) is not None:
            calls.append(kwargs["input_ids"].shape[0])

    return decoder.lm.model.register_forward_hook(record, with_kwargs=True)


def _one_by_one(decoder, prompts, **overrides):
    return [decoder.generate(p, **overrides) for p in prompts]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(mode="nest", **COPY),
        dict(mode="nest"),
        dict(mode="nest", gamma=0.05, alpha=5.0, delta=1.0),
        dict(mode="nest", **MIXED),
        dict(mode="nest", **{**MIXED, "alpha": 5.0, "delta": 1.0}),
        dict(mode="base"),
        dict(mode="knnlm"),
        dict(mode="nest", use_chat_template=False, **COPY),
    ],
    ids=["nest-copying", "nest-default", "nest-strict", "nest-mixed", "nest-rejecting", "base", "knnlm", "nest-plain-text"],
)
def test_batch_equals_one_by_one(decoder, overrides):
    calls = []
    hook = _count_decoding_forwards(decoder, calls)
    try:
        batched = batched_generate(decoder, PROMPTS, [None] * len(PROMPTS), **overrides)
    finally:
        hook.remove()
    single = _one_by_one(decoder, PROMPTS, **overrides)
    _same(batched, single)
    # One prefill per row, then shared forwards: far fewer LM calls than one by one.
    assert max(calls) == len(PROMPTS) and len(calls) < sum(o.stats.forward_passes for o in single)


@pytest.mark.parametrize(
    "overrides",
    [dict(use_chat_template=False, max_new_tokens=40, **COPY), dict(MIXED), dict(MIXED, stop=[" the", "."])],
    ids=["source-end", "length", "stop-strings"],
)
def test_rows_finish_at_different_steps_and_leave(decoder, overrides):
    prompts = ["Quixotic zebras", "Tell me about the comet catalogue.", "Alan Turing was", "Quixotic", "Who?"]
    single = _one_by_one(decoder, prompts, mode="nest", **overrides)
    assert len({o.stats.forward_passes for o in single}) > 1, "the rows end after different numbers of steps"
    _same(batched_generate(decoder, prompts, [None] * len(prompts), mode="nest", **overrides), single)


def test_queue_joins_rows_into_a_running_batch(decoder):
    overrides = dict(mode="nest", **MIXED)
    single = _one_by_one(decoder, PROMPTS, **overrides)
    for max_batch in (1, 3):
        _same(batched_generate(decoder, PROMPTS, [None] * len(PROMPTS), max_batch=max_batch, **overrides), single)


def test_compaction_keeps_outputs(decoder, monkeypatch):
    monkeypatch.setattr(batching, "_COMPACT_SLACK", 0)
    compactions = []
    compact = _BatchCache.compact_if_sparse

    def counted(self):
        columns = self.columns
        compact(self)
        compactions.append(self.columns < columns)

    monkeypatch.setattr(_BatchCache, "compact_if_sparse", counted)
    overrides = dict(mode="nest", **MIXED)
    _same(batched_generate(decoder, PROMPTS, [None] * len(PROMPTS), **overrides), _one_by_one(decoder, PROMPTS, **overrides))
    assert any(compactions)


def test_sampling_with_a_seed_equals_one_by_one(decoder):
    overrides = dict(mode="nest", do_sample=True, temperature=0.8, seed=7)
    _same(batched_generate(decoder, PROMPTS, [None] * len(PROMPTS), **overrides), _one_by_one(decoder, PROMPTS, **overrides))


def test_edge_cases(decoder):
    assert batched_generate(decoder, [], []) == []
    out = batched_generate(decoder, PROMPTS[:2], [None, None], max_new_tokens=0)
    assert [o.text for o in out] == ["", ""] and all(o.stats.finish_reason == "length" for o in out)
    _same(batched_generate(decoder, ["", "Hi"], [None, None], use_chat_template=False, max_new_tokens=4),
          _one_by_one(decoder, ["", "Hi"], use_chat_template=False, max_new_tokens=4))


def test_per_row_queries_and_passages(decoder, small_passages):
    curie, turing = small_passages[0], small_passages[1]
    prompts = ["Tell me a bio.", "Tell me a bio."]
    batched = batched_generate(decoder, prompts, ["Marie Curie", "Alan Turing"], [[(curie, 1.0)], [(turing, 1.0)]], **COPY)
    single = [
        decoder.generate(prompts[0], query="Marie Curie", passages=[(curie, 1.0)], **COPY),
        decoder.generate(prompts[1], query="Alan Turing", passages=[(turing, 1.0)], **COPY),
    ]
    _same(batched, single)
    assert {s.id for s in batched[0].sources} <= {"curie"} and {s.id for s in batched[1].sources} <= {"turing"}


def test_batch_cache_compaction_right_aligns_valid_columns():
    from transformers import DynamicCache

    batch = _BatchCache()
    for length, seed in ((3, 0), (5, 1)):
        cache = DynamicCache()
        torch.manual_seed(seed)
        cache.update(torch.randn(1, 2, length, 4), torch.randn(1, 2, length, 4), 0)
        batch.join(cache, length)
    assert batch.valid.tolist() == [[False, False, True, True, True], [True] * 5]
    layer = batch.cache.layers[0]
    before = layer.keys.clone()
    batch.valid[1, 1] = False  # as if a draft token there was rejected
    batch.valid = torch.cat([batch.valid, torch.zeros(2, 200, dtype=torch.bool)], 1)
    layer.keys = torch.cat([layer.keys, torch.zeros(2, 2, 200, 4)], 2)
    layer.values = torch.cat([layer.values, torch.zeros(2, 2, 200, 4)], 2)
    batch.compact_if_sparse()
    assert batch.valid.tolist() == [[False, True, True, True], [True] * 4]
    torch.testing.assert_close(layer.keys[0, :, 1:], before[0, :, 2:])
    torch.testing.assert_close(layer.keys[1], before[1][:, [0, 2, 3, 4]])
    batch.keep_rows([1])
    assert batch.rows == 1 and layer.keys.shape[0] == 1


def test_supports_batching(tiny_lm):
    assert supports_batching(tiny_lm.model)

    class Config:
        layer_types = ["sliding_attention", "full_attention"]

    class Model:
        config = Config()

    assert not supports_batching(Model())


def test_generate_batch_runs_the_rows_together(decoder):
    calls = []
    hook = _count_decoding_forwards(decoder, calls)
    try:
        batched = decoder.generate_batch(PROMPTS, max_batch=4, mode="nest", **MIXED)
    finally:
        hook.remove()
    assert max(calls) == 4
    _same(batched, _one_by_one(decoder, PROMPTS, mode="nest", **MIXED))
