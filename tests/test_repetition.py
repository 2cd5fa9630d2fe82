"""The repetition guard: copies and picks never complete a run of tokens the answer already holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.policy.repetition import repeat_free_length, repeating_tokens
from conftest import ListRetriever
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

tokens = st.lists(st.integers(0, 3), max_size=30)


def _grams(seq, n):
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


@settings(max_examples=300, deadline=None)
@given(tokens, tokens, st.integers(1, 5))
def test_the_kept_prefix_repeats_nothing_and_the_cut_token_would(history, span, n):
    k = repeat_free_length(history, span, n)
    whole = history + span[:k]
    new = _grams(whole, n)[max(0, len(history) - n + 1) :]  # the n-grams that end inside the kept span
    earlier = _grams(history, n)
    for i, gram in enumerate(new):
        assert gram not in earlier and gram not in new[:i]
    if k < len(span):
        assert tuple((whole + [span[k]])[-n:]) in _grams(whole, n)


@settings(max_examples=300, deadline=None)
@given(tokens, st.integers(1, 5), st.integers(0, 3))
def test_repeating_tokens_are_exactly_those_completing_a_seen_ngram(history, n, token):
    completes = len(history) >= n - 1 and tuple((history + [token])[-n:]) in _grams(history, n)
    assert (token in repeating_tokens(history, n)) == completes


def test_zero_turns_the_guard_off():
    assert repeat_free_length([1, 2, 1, 2], [1, 2, 1, 2], 0) == 4
    assert repeating_tokens([1, 2, 1, 2], 0) == set()


def test_an_answer_never_loops(tiny_lm):
    """The random tiny LM loops once its copy is done ("the the the ..."); guarded, neither
    the copy nor the LM's own tokens complete a run of ``repeat_ngram`` tokens twice."""
    passages = [Passage(id="fox", title="Fox", text="The quick brown fox jumps over the lazy dog near the old mill.")]
    store = TokenDatastore(passages, PassageEncoder(tiny_lm))
    copy = dict(mode="nest", alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6, stop_at_source_end=False, answer_focus=False, max_new_tokens=60)
    decoder = NestDecoder(tiny_lm, store, ListRetriever(passages), NestConfig(**copy))
    guarded = decoder.generate("Tell me about the fox.")
    unguarded = decoder.generate("Tell me about the fox.", repeat_ngram=0, lm_repeat_ngram=0)
    assert guarded.attribution_ratio > 0 and guarded.text.startswith(passages[0].text)

    def repeats(output):  # re-tokenising the text may merge tokens at a seam: a little slack over 8
        grams = _grams(tiny_lm.tokenizer(output.text, add_special_tokens=False)["input_ids"], 10)
        return len(grams) - len(set(grams))

    assert repeats(unguarded) > 0, "the premise: without the guard this answer loops"
    assert repeats(guarded) == 0, guarded.text
