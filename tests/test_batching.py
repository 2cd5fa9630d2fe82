"""The row scheduler (nest_integrations.decoding.batching): batched generation equals one-by-one generation
(each prompt decoded alone in its own KV cache, the path of models that cannot share a batch)."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding import batching
from nest_integrations.decoding.batching import _PackedCache, batched_generate, supports_batching
from nest_integrations.decoding.decoder import NestDecoder
from conftest import ListRetriever
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

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
    """Hook recording each decoding forward (those with a KV cache; datastore encoding has none)."""

    def record(module, args, kwargs, out):
        if kwargs.get(decoder.cache_arg) is not None:
            calls.append(kwargs["input_ids"].shape[1])

    return decoder.lm.model.register_forward_hook(record, with_kwargs=True)


def _one_by_one(decoder, prompts, queries=None, passages=None, **overrides):
    """Each prompt decoded alone in its own KV cache (a batch of one in this thread)."""
    shares, decoder.shares_batches = decoder.shares_batches, False
    try:
        queries = queries or [None] * len(prompts)
        passages = passages or [None] * len(prompts)
        return [decoder.generate(p, query=q, passages=ps, **overrides) for p, q, ps in zip(prompts, queries, passages)]
    finally:
        decoder.shares_batches = shares


def _batched(decoder, prompts, queries=None, passages=None, max_batch=None, **overrides):
    config = decoder._call_config(overrides)
    queries = queries or [None] * len(prompts)
    passages = passages or [None] * len(prompts)
    rows = [decoder.prepare_row(p, q, ps, config) for p, q, ps in zip(prompts, queries, passages)]
    return batched_generate(rows, decoder.shared_lm, max_batch=max_batch or max(len(prompts), 1))


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
def test_batch_equals_one_by_one(decoder, overrides, shared_rows):
    calls = []
    hook = _count_decoding_forwards(decoder, calls)
    try:
        batched = _batched(decoder, PROMPTS, **overrides)
    finally:
        hook.remove()
    batch_rows = list(shared_rows)
    single = _one_by_one(decoder, PROMPTS, **overrides)
    _same(batched, single)
    # The prompts are prefilled together in the first shared forward, and every LM call is a
    # shared one: far fewer than one by one.
    assert batch_rows[0] == max(batch_rows) == len(PROMPTS) and len(calls) == len(batch_rows)
    assert len(calls) < sum(o.stats.forward_passes for o in single)


@pytest.mark.parametrize(
    "overrides",
    [dict(use_chat_template=False, max_new_tokens=40, **COPY), dict(MIXED), dict(MIXED, stop=[" the", "."])],
    ids=["source-end", "length", "stop-strings"],
)
def test_rows_finish_at_different_steps_and_leave(decoder, overrides):
    prompts = ["Quixotic zebras", "Tell me about the comet catalogue.", "Alan Turing was", "Quixotic", "Who?"]
    single = _one_by_one(decoder, prompts, mode="nest", **overrides)
    assert len({o.stats.forward_passes for o in single}) > 1, "the rows end after different numbers of steps"
    _same(_batched(decoder, prompts, mode="nest", **overrides), single)


def test_queue_joins_rows_into_a_running_batch(decoder):
    overrides = dict(mode="nest", **MIXED)
    single = _one_by_one(decoder, PROMPTS, **overrides)
    for max_batch in (1, 3):
        _same(_batched(decoder, PROMPTS, max_batch=max_batch, **overrides), single)


def test_compaction_keeps_outputs(decoder, monkeypatch):
    monkeypatch.setattr(batching, "_COMPACT_SLACK", 0)
    compactions = []
    compact = _PackedCache.compact_if_sparse

    def counted(self):
        columns = self.columns
        compact(self)
        compactions.append(self.columns < columns)

    monkeypatch.setattr(_PackedCache, "compact_if_sparse", counted)
    overrides = dict(mode="nest", **MIXED)
    _same(_batched(decoder, PROMPTS, **overrides), _one_by_one(decoder, PROMPTS, **overrides))
    assert any(compactions)


def test_sampling_with_a_seed_equals_one_by_one(decoder):
    overrides = dict(mode="nest", do_sample=True, temperature=0.8, seed=7)
    _same(_batched(decoder, PROMPTS, **overrides), _one_by_one(decoder, PROMPTS, **overrides))


def test_edge_cases(decoder):
    assert _batched(decoder, []) == []
    out = _batched(decoder, PROMPTS[:2], max_new_tokens=0)
    assert [o.text for o in out] == ["", ""] and all(o.stats.finish_reason == "length" for o in out)
    _same(_batched(decoder, ["", "Hi"], use_chat_template=False, max_new_tokens=4),
          _one_by_one(decoder, ["", "Hi"], use_chat_template=False, max_new_tokens=4))


def test_per_row_queries_and_passages(decoder, small_passages):
    curie, turing = small_passages[0], small_passages[1]
    prompts = ["Tell me a bio.", "Tell me a bio."]
    queries, passages = ["Marie Curie", "Alan Turing"], [[(curie, 1.0)], [(turing, 1.0)]]
    batched = _batched(decoder, prompts, queries, passages, **COPY)
    _same(batched, _one_by_one(decoder, prompts, queries, passages, **COPY))
    assert {s.id for s in batched[0].sources} <= {"curie"} and {s.id for s in batched[1].sources} <= {"turing"}


def test_packed_cache_releases_and_compacts():
    batch = _PackedCache()
    keys = torch.randn(1, 2, 5, 4)
    batch.cache.update(keys, keys + 1, 0)  # as a shared forward appends its fed tokens
    batch.owner = torch.tensor([3, 3, 8, 8, 8])
    originals = [keys[:, :, :2], keys[:, :, 2:]]
    layer = batch.cache.layers[0]
    assert batch.owner.tolist() == [3, 3, 8, 8, 8] and layer.keys.shape[2] == 5
    batch.owner[3] = -1  # a rejected draft token of row 8
    batch.compact_if_sparse()  # one dead column: not worth a copy
    batch.trim_tail()  # not at the end: stays
    assert batch.columns == 5
    batch.release(3)
    old_slack = batching._COMPACT_SLACK
    batching._COMPACT_SLACK = 0
    try:
        batch.compact_if_sparse()
    finally:
        batching._COMPACT_SLACK = old_slack
    assert batch.owner.tolist() == [8, 8]
    torch.testing.assert_close(layer.keys, originals[1][:, :, [0, 2]])
    torch.testing.assert_close(layer.values, originals[1][:, :, [0, 2]] + 1)
    batch.owner[1] = -1  # a rejected last draft token: cropped, not copied
    batch.trim_tail()
    assert batch.owner.tolist() == [8] and layer.keys.shape[2] == 1


def test_supports_batching(tiny_lm):
    assert supports_batching(tiny_lm.model)

    class Config:
        layer_types = ["sliding_attention", "full_attention"]

    class Model:
        config = Config()

    assert not supports_batching(Model())


def test_generate_batch_runs_the_rows_together(decoder, shared_rows):
    batched = decoder.generate_batch(PROMPTS, max_batch=4, mode="nest", **MIXED)
    assert max(shared_rows) == 4
    _same(batched, _one_by_one(decoder, PROMPTS, mode="nest", **MIXED))
