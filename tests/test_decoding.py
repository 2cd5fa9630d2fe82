"""The NEST decoder on the tiny random Llama: modes, spans, speculation, streaming, edge cases."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
import torch

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.abstention import see_also
from nest_integrations.decoding.chunk_chain import next_chunk
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.decoding.rendering import MODEL_MARK, model_written, render_html, render_markdown, render_terminal
from nest_integrations.decoding.spans import merge_spans
from nest_integrations.decoding import proposer as proposer_module
from nest_integrations.decoding import verifier as verifier_module
from nest_integrations.decoding.proposal import WholeEnds
from nest_integrations.decoding.verifier import whole_prefix
from nest_integrations.policy.mentions import CorpusTerms
from conftest import ListRetriever, word_share
from nest_integrations.core.mixture import knn_distribution, mix, rrc_lambda
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

PROMPT = "Tell me about the comet catalogue."
# Retrieval dominates: lambda ~ 0 at every step, and acceptance is lenient.
COPY = dict(alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6)
UNIQUE = "Quixotic zebras juggle seventeen luminous marmalade jars beneath Harrogate."
KEEPER = " Their keeper, Ottoline Frump, counts every jar at dawn."


@pytest.fixture
def decoder(tiny_lm, tiny_datastore, small_passages):
    return NestDecoder(tiny_lm, tiny_datastore, ListRetriever(small_passages), NestConfig(max_new_tokens=24))


def _spans_ok(output, passages_by_id):
    assert "".join(s.text for s in output.spans) == output.text
    pos = 0
    for span in output.spans:
        assert span.start == pos and output.text[span.start : span.end] == span.text
        pos = span.end
        if span.copied:
            src = passages_by_id[span.source.id]
            assert src.text[span.source.chunk_char_start : span.source.chunk_char_end] == span.text
    assert pos == len(output.text)


def test_base_equals_transformers_greedy_generate(decoder, tiny_lm):
    out = decoder.generate(PROMPT, mode="base", max_new_tokens=16)
    ids = tiny_lm.tokenizer(decoder.format_prompt(PROMPT, decoder.config), return_tensors="pt").input_ids
    calls = {"n": 0}
    hook = tiny_lm.model.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    try:
        reference = tiny_lm.model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    finally:
        hook.remove()
    expected = tiny_lm.tokenizer.decode(reference[0, ids.shape[1] :], skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert out.text == expected
    assert out.stats.new_tokens == 16 and out.stats.forward_passes == calls["n"]


def test_knnlm_with_lambda_one_equals_base(decoder):
    base = decoder.generate(PROMPT, mode="base")
    knn = decoder.generate(PROMPT, mode="knnlm", knnlm_lambda=1.0)
    assert knn.text == base.text and knn.attribution_ratio == 0.0


def test_mixture_matches_a_hand_computed_one():
    scores = torch.tensor([[-1.0, -2.0, -4.0]])
    values = torch.tensor([[5, 7, 5]])
    p_knn = knn_distribution(scores, values, 10, temperature=1.0)
    w = torch.softmax(torch.tensor([-1.0, -2.0, -4.0]), 0)
    assert torch.isclose(p_knn[0, 5], w[0] + w[2]) and torch.isclose(p_knn[0, 7], w[1])
    lam = rrc_lambda(scores, alpha=0.3, tau=0.1)
    assert torch.isclose(lam[0], torch.sigmoid(torch.tensor((1.0 / 4.0 - 0.3) / 0.1)))
    p_lm = torch.full((1, 10), 0.1)
    p_m = mix(p_lm, p_knn, lam)
    assert torch.isclose(p_m[0, 5], lam[0] * 0.1 + (1 - lam[0]) * (w[0] + w[2]))
    assert torch.isclose(p_m.sum(), torch.tensor(1.0))


def test_one_step_p_m_equals_hand_mixture(decoder, tiny_lm):
    scored = decoder.score(PROMPT, " Zoë", mode="nest")
    assert scored.logp_mixture.shape == scored.lam.shape
    lm_only = decoder.score(PROMPT, " Zoë", mode="base")
    torch.testing.assert_close(lm_only.logp_mixture, lm_only.logp_lm)


def test_copied_spans_are_verbatim_and_tile_the_output(decoder, small_passages):
    out = decoder.generate(PROMPT, **COPY)
    assert out.copied_spans, "with retrieval dominating, NEST copies"
    _spans_ok(out, {p.id: p for p in small_passages})
    assert 0 < out.attribution_ratio <= 1 and out.mean_copied_span_tokens > 1
    assert {s.id for s in out.sources} <= {p.id for p in small_passages}


def test_unique_sentence_is_copied_verbatim_and_cited(tiny_lm):
    unique = Passage(id="u1", title="Unique", text=UNIQUE)
    other = Passage(id="o1", title="Other", text="Rain fell on the quiet town for most of the afternoon.")
    store = TokenDatastore([unique, other], PassageEncoder(tiny_lm))
    dec = NestDecoder(tiny_lm, store, ListRetriever([unique, other]))
    out = dec.generate("Quixotic zebras", max_new_tokens=20, use_chat_template=False, **COPY)
    copied = "".join(s.text for s in out.copied_spans if s.source.id == "u1")
    assert "juggle seventeen luminous marmalade jars" in copied


def test_generation_stops_where_its_source_ends(tiny_lm):
    unique = Passage(id="u1", title="Unique", text=UNIQUE)
    dec = NestDecoder(tiny_lm, TokenDatastore([unique], PassageEncoder(tiny_lm)), ListRetriever([unique]))
    out = dec.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, **COPY)
    assert out.text.endswith("beneath Harrogate.") and out.stats.finish_reason == "source_end"
    assert out.stats.new_tokens < 40
    longer = dec.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, stop_at_source_end=False, **COPY)
    assert longer.stats.new_tokens == 40 and longer.stats.finish_reason == "length"
    assert longer.text.startswith(out.text)


def test_a_later_chunk_of_the_same_document_keeps_copying_going(tiny_lm):
    first = Passage(id="d#0", title="Zebras", text=UNIQUE, doc_id="d")
    second = Passage(id="d#1", title="Zebras", text=KEEPER, doc_id="d", doc_char_start=len(UNIQUE))
    dec = NestDecoder(tiny_lm, TokenDatastore([first, second], PassageEncoder(tiny_lm)), ListRetriever([first, second]))
    out = dec.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, **COPY)
    assert "beneath Harrogate." in out.text and not out.text.endswith("beneath Harrogate.")
    alone = NestDecoder(tiny_lm, dec.datastore, ListRetriever([first]))
    assert alone.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, **COPY).stats.finish_reason == "source_end"


def test_speculation_saves_forward_passes(decoder):
    out = decoder.generate(PROMPT, max_new_tokens=24, **COPY)
    assert out.stats.forward_passes < out.stats.new_tokens


def test_smaller_gamma_never_shortens_accepted_spans(decoder):
    lengths = []
    for gamma in (0.5, 1e-2, 1e-6):
        out = decoder.generate(PROMPT, alpha=5.0, delta=1.0, gamma=gamma)
        lengths.append(out.stats.new_tokens / out.stats.forward_passes)
    assert lengths == sorted(lengths)


def test_streaming_equals_non_streaming(decoder):
    full = decoder.generate(PROMPT, **COPY)
    chunks = list(decoder.stream(PROMPT, **COPY))
    assert "".join(c.text for c in chunks) == full.text
    assert merge_spans([s for c in chunks for s in c.spans]) == full.spans
    assert chunks[-1].output == full.model_copy(update={"stats": chunks[-1].output.stats})


def test_batch_equals_one_by_one(decoder):
    prompts = [PROMPT, "Who was Alan Turing?"]
    batch = decoder.generate_batch(prompts, **COPY)
    single = [decoder.generate(p, **COPY) for p in prompts]
    assert [o.text for o in batch] == [o.text for o in single]
    assert [o.spans for o in batch] == [o.spans for o in single]


def test_stop_strings_cut_the_text(decoder):
    full = decoder.generate(PROMPT, **COPY)
    word = full.text.split()[3]
    out = decoder.generate(PROMPT, stop=[word], **COPY)
    assert word not in out.text and full.text.startswith(out.text)
    assert "".join(s.text for s in out.spans) == out.text


def test_edge_cases(decoder, tiny_lm):
    assert decoder.generate(PROMPT, max_new_tokens=0).text == ""
    assert decoder.generate("", max_new_tokens=4, use_chat_template=False).stats.new_tokens == 4
    long_prompt = "word " * 5000
    out = decoder.generate(long_prompt, max_new_tokens=4, max_prompt_tokens=200)
    assert out.stats.prompt_truncated and out.stats.prompt_tokens == 200
    with pytest.raises(ValueError):
        decoder.generate(PROMPT, mode="teleport")
    with pytest.raises(ValueError):
        decoder.generate(PROMPT, gamma=0)
    out = decoder.generate("Ωμέγα ☃ 東京 — naïve café?", max_new_tokens=8)
    assert out.stats.new_tokens == 8


def test_fallback_to_the_lm_says_why(tiny_lm, tiny_datastore, small_passages):
    empty = TokenDatastore([], PassageEncoder(tiny_lm))
    out = NestDecoder(tiny_lm, empty, ListRetriever([])).generate(PROMPT, max_new_tokens=6, lm_repeat_ngram=0, fallback="lm")
    assert out.stats.fallback_reason == "nothing_retrieved" and not out.stats.copied_from_datastore
    # The LM alone: the base mode's text, but for the repetition guard NEST keeps on its picks.
    assert out.text == NestDecoder(tiny_lm, empty).generate(PROMPT, max_new_tokens=6, mode="base").text
    assert NestDecoder(tiny_lm, empty).generate(PROMPT, max_new_tokens=2).stats.fallback_reason == "no_retriever"
    blank = Passage(id="blank", text="<|endoftext|>")  # special tokens only: no datastore entry
    out = NestDecoder(tiny_lm, empty, ListRetriever([blank])).generate(PROMPT, max_new_tokens=2)
    assert out.stats.fallback_reason == "empty_datastore"
    copying = NestDecoder(tiny_lm, tiny_datastore, ListRetriever(small_passages)).generate(PROMPT, max_new_tokens=2)
    assert copying.stats.fallback_reason is None and copying.stats.copied_from_datastore
    assert copying.to_dict()["stats"]["fallback_reason"] is None
    assert NestDecoder(tiny_lm, empty).generate(PROMPT, max_new_tokens=2, mode="base").stats.fallback_reason is None


def test_relevance_gate_falls_back_when_nothing_is_relevant(tiny_lm, tiny_datastore, small_passages):
    dec = NestDecoder(tiny_lm, tiny_datastore, ListRetriever(small_passages), relevance=lambda q, ps: [0.0] * len(ps))
    out = dec.generate(PROMPT, max_new_tokens=8, min_passage_relevance=0.5, fallback="lm", **COPY)
    assert out.attribution_ratio == 0.0 and out.stats.fallback_reason == "nothing_relevant"
    assert (out.stats.gate_retrieved, out.stats.gate_kept) == (len(small_passages), 0)


def test_a_question_nothing_answers_gets_a_plain_abstention(tiny_lm, tiny_datastore, small_passages):
    """By default the LM does not answer alone: the text says the documents do not cover the
    question, names the nearest retrieved sections, copies and cites nothing."""
    dec = NestDecoder(tiny_lm, tiny_datastore, ListRetriever(small_passages), relevance=lambda q, ps: [0.0] * len(ps))
    for mode in ("nest", "ra_nest"):
        out = dec.generate(PROMPT, min_passage_relevance=0.5, mode=mode)
        assert out.text == "The documents do not cover this question.\nSee also: curie; turing; zoe."
        assert out.stats.finish_reason == "not_covered" and out.stats.fallback_reason == "nothing_relevant"
        assert out.attribution_ratio == 0.0 and not out.sources and not out.copied_spans
        assert "".join(span.text for span in out.spans) == out.text
    nothing = NestDecoder(tiny_lm, tiny_datastore, ListRetriever([])).generate(PROMPT)
    assert nothing.text == "The documents do not cover this question." and nothing.stats.finish_reason == "not_covered"
    # Text completion (a plain prompt) and the baselines still write with the LM.
    plain = dec.generate(PROMPT, min_passage_relevance=0.5, use_chat_template=False, max_new_tokens=4)
    assert plain.stats.finish_reason != "not_covered" and plain.stats.new_tokens == 4
    assert dec.generate(PROMPT, min_passage_relevance=0.5, mode="knnlm", max_new_tokens=4).stats.finish_reason != "not_covered"
    # Streaming and batches give the same abstention.
    chunks = list(dec.stream(PROMPT, min_passage_relevance=0.5))
    assert "".join(c.text for c in chunks) == out.text
    batch = dec.generate_batch([PROMPT, PROMPT], min_passage_relevance=0.5, max_batch=2)
    assert [o.text for o in batch] == [out.text, out.text]


def test_see_also_names_each_document_once_with_its_sections_in_order():
    """Three sections of one file read as one entry, not as the file three times; a document's
    untitled opening adds nothing where its titled sections are named; the common folder goes."""
    def section(doc: str, title: str, i: int) -> Passage:
        text = f"## {title}\n\nSome words about {title}." if title else "Words before any heading."
        return Passage(id=f"{doc}#{i}", text=text, metadata={"source": f"/srv/docs/{doc}"}, doc_id=doc)

    hits = [section("transfers.md", "", 0), section("transfers.md", "Uploads", 1), section("batch.md", "Errors", 2),
            section("transfers.md", "Errors", 3), section("locking.md", "Locks", 4)]
    assert see_also(hits) == ["transfers.md (Uploads)", "batch.md (Errors)"]
    assert see_also(hits, limit=4) == ["transfers.md (Uploads; Errors)", "batch.md (Errors)"]
    assert see_also(hits[:1]) == ["transfers.md"]


def test_a_question_naming_what_the_corpus_never_mentions_is_not_covered(tiny_lm, tiny_datastore, small_passages):
    """Retrieval always finds something near; a question about PowerShell over documents that never
    name it gets the abstention, and says which name is missing, while a question about a name the
    corpus holds (any case, any accents) is answered."""
    terms = CorpusTerms(p.text for p in small_passages)
    dec = NestDecoder(tiny_lm, tiny_datastore, ListRetriever(small_passages), corpus_terms=terms)
    out = dec.generate("How do I run the comet catalogue from PowerShell?")
    assert out.text.startswith("The documents do not cover this question. They never mention PowerShell.\nSee also: ")
    assert out.stats.finish_reason == "not_covered" and out.stats.fallback_reason == "not_mentioned" and not out.sources
    answered = dec.generate("Which comets did Zoe Angstrom catalogue?", max_new_tokens=4, **COPY)
    assert answered.stats.fallback_reason is None and answered.stats.finish_reason != "not_covered"
    # Text completion is no question: it is never turned away.
    assert dec.generate("PowerShell", use_chat_template=False, max_new_tokens=2).stats.fallback_reason is None
    # A name in a statement of the user's setting is not what is asked.
    set_up = dec.generate("I keep my notes in PowerShell. Which comets did Zoe Angstrom catalogue?", max_new_tokens=4, **COPY)
    assert set_up.stats.fallback_reason is None and set_up.stats.finish_reason != "not_covered"


def test_renderers_show_sources(decoder):
    out = decoder.generate(PROMPT, **COPY)
    md = render_markdown(out)
    location = out.copied_spans[0].source.location
    assert "\\[1\\]" in md and out.sources[0].title in md and location.describe() in md
    html = render_html(out)
    assert "<mark" in html and "title=" in html and location.describe() in html
    assert render_terminal(out) is not None


def test_a_copy_continues_past_the_overlap_into_the_next_chunk(tiny_lm):
    text = UNIQUE + KEEPER
    cut = len(UNIQUE)
    overlap = text.index(" beneath")  # the second chunk repeats " beneath Harrogate." of the first
    first = Passage(id="d#0", text=text[:cut], doc_id="d")
    second = Passage(id="d#1", text=text[overlap:], doc_id="d", doc_char_start=overlap)
    dec = NestDecoder(tiny_lm, TokenDatastore([first, second], PassageEncoder(tiny_lm)), ListRetriever([first, second]))
    candidates = dec.datastore.candidates([0, 1])
    pidx, pos = next_chunk(dec.datastore.passages, candidates, 0)
    span = candidates.passage(pidx).char_spans[pos]
    assert pidx == 1 and second.text[span[0]:].startswith(" Their keeper"), "the repeated words are skipped"
    out = dec.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, **COPY)
    assert "beneath Harrogate. Their keeper" in out.text and out.text.count("Harrogate") == 1


def test_a_model_without_chat_template_reads_a_conversation_as_a_plain_transcript(tiny_lm):
    """A base model gets the conversation as 'User: ... / Assistant:' text and answers after the
    open 'Assistant:' line; text to continue (use_chat_template=False) stays as it is."""
    import copy

    from nest_integrations.core.config import NestConfig
    from nest_integrations.decoding.decoder import NestDecoder

    base = copy.copy(tiny_lm)
    base.tokenizer = copy.deepcopy(tiny_lm.tokenizer)
    base.tokenizer.chat_template = None
    decoder = NestDecoder(base)
    messages = [
        {"role": "user", "content": "What is a route?"},
        {"role": "assistant", "content": "A URL and a handler."},
        {"role": "user", "content": "And a hook?"},
    ]
    text = decoder.format_prompt(messages, NestConfig(system_prompt="Answer briefly."))
    assert text == "Answer briefly.\nUser: What is a route?\nAssistant: A URL and a handler.\nUser: And a hook?\nAssistant:\n"
    assert decoder.format_prompt("Tell me a bio of Ada Lovelace.", NestConfig()) == "User: Tell me a bio of Ada Lovelace.\nAssistant:\n"
    assert decoder.format_prompt("Once upon a time", NestConfig(use_chat_template=False)) == "Once upon a time"
    out = decoder.generate("Tell me a bio of Ada Lovelace.", mode="base", max_new_tokens=3)
    assert out.stats.prompt_tokens == len(base.tokenizer("User: Tell me a bio of Ada Lovelace.\nAssistant:\n")["input_ids"])
    # A base model that goes on to write the user's next turn stops before it; text to continue does not.
    assert decoder.prepare_row("Tell me a bio of Ada Lovelace.", None, None, NestConfig(mode="base")).gen.config.stop == ["\nUser:"]
    assert decoder.prepare_row("Once", None, None, NestConfig(mode="base", use_chat_template=False)).gen.config.stop == []


def test_a_question_copies_its_best_answer_windows_in_turn_and_stops_answered(tiny_lm):
    """The best windows, in turn, each after the line break of the one before: three by default."""
    body = "The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients."
    idle = "The `keepAliveTimeout` option sets how many milliseconds an idle socket stays open before it closes."
    unrelated = "Unrelated words about the logging levels and the colours of the terminal go here."
    doc = Passage(id="srv", title="Server", text=f"## Options\n\n{body}\n\n{unrelated}\n\n{idle}\n")
    store = TokenDatastore([doc], PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0, max_new_tokens=80)
    decoder = NestDecoder(tiny_lm, store, ListRetriever([doc]), NestConfig(**knobs), relevance=word_share)
    question = "How many milliseconds does an idle socket stay open, and which option sets the largest request body?"
    every = decoder.generate([{"role": "user", "content": question}], query=question)  # answer_windows=3
    assert every.text == f" Options\n\n{idle}\n\n{body}\n\n{unrelated}", every.text
    both = decoder.generate([{"role": "user", "content": question}], query=question, answer_windows=2, fill_windows=0)
    assert both.text == f" Options\n\n{idle}\n\n{body}", both.text  # the section's title labels the answer
    assert both.stats.finish_reason == "answered" and both.attribution_ratio == 1.0
    one = decoder.generate([{"role": "user", "content": question}], query=question, answer_windows=1, fill_windows=0)
    assert one.text == f" Options\n\n{idle}" and one.stats.finish_reason == "answered"


def test_a_fill_window_is_copied_only_when_it_fits_whole(tiny_lm):
    """A window past the answer_windows best ones is copied when it fits in what is left of the
    budget; one that would be cut is left out, and the answer ends answered, not mid-sentence."""
    idle = "The `keepAliveTimeout` option sets how many milliseconds an idle socket stays open before it closes."
    body = "The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients."
    doc = Passage(id="srv", text=f"{idle}\n\n{body}\n")
    store = TokenDatastore([doc], PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0, answer_windows=1)
    decoder = NestDecoder(tiny_lm, store, ListRetriever([doc]), NestConfig(**knobs), relevance=word_share)
    question = "How many milliseconds does an idle socket stay open, and which option sets the largest request body?"
    ask = lambda **kw: decoder.generate([{"role": "user", "content": question}], query=question, **kw)  # noqa: E731
    assert ask(max_new_tokens=80).text == f"{idle}\n\n{body}"  # the fill window fits
    short = len(tiny_lm.tokenizer(idle, add_special_tokens=False).input_ids) + 5
    alone = ask(max_new_tokens=short)
    assert alone.text == idle and alone.stats.finish_reason == "answered"
    exact = ask(max_new_tokens=alone.stats.new_tokens)  # the window's last token is the budget's last
    assert exact.text == idle and exact.stats.finish_reason == "answered"
    cut = ask(max_new_tokens=short, answer_windows=2, fill_windows=0)  # the same window as a second answer window
    assert cut.text == idle and cut.stats.finish_reason == "length"  # cut, its one sentence would end mid-way


@pytest.mark.parametrize("span_length", [64, 4], ids=["one-span", "spans-of-4"])
def test_a_budget_that_ends_inside_a_copied_sentence_ends_the_answer_at_the_sentence_before(tiny_lm, span_length):
    """A token budget that would cut a copied sentence ends the answer after the last whole
    sentence it reaches (``length``), not on a fragment of the next ("... stays open. It"), also
    when the copy comes in spans shorter than the sentence (the sentence's end is read ahead);
    a budget that reaches no sentence end of the copy cuts it as before."""
    first = "The `keepAliveTimeout` option sets how many milliseconds an idle socket stays open."
    second = "It defaults to seventy-two seconds, which outlasts the idle timeouts of most load balancers."
    doc = Passage(id="srv", text=f"## Options\n\n{first} {second}\n")
    store = TokenDatastore([doc], PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0, answer_windows=1, fill_windows=0)
    decoder = NestDecoder(tiny_lm, store, ListRetriever([doc]), NestConfig(**knobs, span_length=span_length), relevance=word_share)
    question = "How long does an idle socket stay open, and which option sets it?"
    ask = lambda budget: decoder.generate([{"role": "user", "content": question}], query=question, max_new_tokens=budget)  # noqa: E731
    whole = ask(80)
    assert whole.text == f" Options\n\n{first} {second}" and whole.stats.finish_reason == "answered", whole.text
    ended = [ask(budget) for budget in range(whole.stats.new_tokens - 1, 0, -1)]
    at_first = [out for out in ended if len(out.text) >= len(f" Options\n\n{first}")]
    assert at_first and all(out.text == f" Options\n\n{first}" and out.stats.finish_reason == "length" for out in at_first)
    assert all(out.attribution_ratio == 1.0 for out in at_first)
    assert [out.stats.new_tokens for out in at_first] == [at_first[0].stats.new_tokens] * len(at_first)
    cut = ended[-1]  # one token: not even the label's end
    assert cut.stats.finish_reason == "length" and cut.stats.new_tokens == 1


def test_a_window_that_announces_an_example_runs_on_into_the_next_chunk_to_its_sections_end(tiny_lm):
    """A window ending "...in a callback:" does not close an answer: the copy runs on past its
    passage's end into the next chunk of its document, which the retriever did not return, past
    the directive line it opens with, and ends where the next section begins."""
    first = "Yes Parameters\n==============\n\nTo ask before a dangerous command, add a ``--yes`` flag and fail in a callback:\n"
    second = (
        "\n.. code-block:: python\n\n    @click.confirmation_option(prompt='Drop the db?')\n    def dropdb():\n        pass\n"
        "\nOther Things\n============\n\nThe colours of the terminal go here.\n"
    )
    chunks = [Passage(id="opts#0", text=first, doc_id="opts"), Passage(id="opts#1", text=second, doc_id="opts", doc_char_start=len(first))]
    store = TokenDatastore(chunks, PassageEncoder(tiny_lm))
    assert store.following_chunk(0) == 1 and store.following_chunk(1) is None
    # The copy past a planned window is the LM's to check: the LM alone (alpha -5) at gamma 1e-6 accepts it.
    knobs = dict(mode="nest", alpha=-5.0, tau=0.1, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0, max_new_tokens=80)
    decoder = NestDecoder(tiny_lm, store, ListRetriever(chunks[:1]), NestConfig(**knobs), relevance=word_share)
    question = "How do I add a --yes flag so that a dangerous command asks first?"
    out = decoder.generate([{"role": "user", "content": question}], query=question)
    assert "fail in a callback:\n\n\n    @click.confirmation_option(prompt='Drop the db?')\n    def dropdb():\n        pass" in out.text, out.text
    assert "code-block" not in out.text and "Other Things" not in out.text, out.text
    assert out.attribution_ratio == 1.0 and [s.source.id for s in out.spans if s.copied][-1] == "opts#1"


def _run_on_answer(tiny_lm, chunks, question, gamma):
    """The answer to ``question`` over the ``chunks`` of one document of which the first stage
    returns the first alone: the copy runs on into the others, checked by the LM alone (alpha -5)
    at ``gamma`` (1e-6 accepts every copy; 1 refuses all but the LM's own best token)."""
    store = TokenDatastore(chunks, PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=-5.0, tau=0.1, delta=1.0, gamma=gamma, min_passage_relevance=-1.0, max_new_tokens=80)
    decoder = NestDecoder(tiny_lm, store, ListRetriever(chunks[:1]), NestConfig(**knobs), relevance=word_share)
    return decoder.generate([{"role": "user", "content": question}], query=question)


@pytest.mark.parametrize("indent", ["", "    "], ids=["indentation-cut", "indentation-kept"])
def test_a_copy_that_crosses_the_white_space_a_chunker_cut_gets_a_paragraph_break_of_no_ones(tiny_lm, indent):
    """A chunker strips the blank line where it cuts (a splitter the indentation too; ``nest index
    build`` keeps it): a copy running on from "...fail in a callback:" into the next chunk's
    "def abort(...)" would run the two onto one line, so the LM's paragraph break is set between
    them (not copied, not the model's words)."""
    first = "Yes Parameters\n==============\n\nTo ask before a dangerous command, add a ``--yes`` flag and fail in a callback:"
    second = f"{indent}def abort_if_false(ctx, param, value):\n        if not value:\n            ctx.abort()\n"
    cut = len(first) + len("\n\n    ") - len(indent)  # the white space the chunker left out
    chunks = [Passage(id="opts#0", text=first, doc_id="opts"), Passage(id="opts#1", text=second, doc_id="opts", doc_char_start=cut)]
    out = _run_on_answer(tiny_lm, chunks, "How do I add a --yes flag so that a dangerous command asks first?", gamma=1e-6)
    assert f"fail in a callback:\n\n{indent}def abort_if_false(ctx, param, value):" in out.text, out.text
    assert ("\n\n", False) in [(span.text, span.copied) for span in out.spans] and not any(model_written(out, span) for span in out.spans)


def test_a_copy_that_crosses_a_cut_inside_a_sentence_gets_the_line_break_the_chunker_cut(tiny_lm):
    """A chunk that ends "... from the official repos, e.g." announces the next one's "with
    ``apt-get``:" and its command; the chunker cut the one line break between them. The copy goes
    on across the cut after a line break set by the decoder, as the sentence's own: a paragraph
    break there would split the sentence in two."""
    first = "Debian\n======\n\nOn Debian, there's a package called ``restic`` which can be\ninstalled from the official repos, e.g."
    second = "with ``apt-get``:\n\n.. code-block:: console\n\n    $ apt-get install restic\n"
    chunks = [Passage(id="inst#0", text=first, doc_id="inst"), Passage(id="inst#1", text=second, doc_id="inst", doc_char_start=len(first) + 1)]
    out = _run_on_answer(tiny_lm, chunks, "How do I install restic on Debian?", gamma=1e-6)
    assert "official repos, e.g.\nwith ``apt-get``:" in out.text, out.text
    assert ("\n", False) in [(span.text, span.copied) for span in out.spans] and not any(model_written(out, span) for span in out.spans)


def test_a_copy_past_a_directive_keeps_its_codes_indentation_not_its_prose_bodys(tiny_lm):
    """The copy runs on from "... run" into the command its code directive announces and on past
    a ``.. seealso::`` line into its body. The command keeps its indentation (a Markdown reader
    shows it as code); the body's is the directive's syntax, and indented four spaces the prose
    would read as code too: it opens at its text, after the decoder's paragraph break."""
    text = (
        "Get the bleeding edge version\n=============================\n\nTo get the latest development version, run\n\n"
        ".. code-block:: shell-session\n\n    $ pip install -U git+https://example.org/marshmallow.git@dev\n\n\n"
        ".. seealso::\n\n    Need help upgrading to newer releases? See the upgrading page.\n"
    )
    out = _run_on_answer(tiny_lm, [Passage(id="inst#0", text=text, doc_id="inst")], "How do I install the latest development version?", gamma=1e-6)
    assert "run\n\n    $ pip install -U git+https://example.org/marshmallow.git@dev" in out.text, out.text
    assert "Need help upgrading to newer releases?" in out.text and "\n    Need help" not in out.text, out.text
    assert ("\n\n", False) in [(span.text, span.copied) for span in out.spans] and not any(model_written(out, span) for span in out.spans)


def test_the_example_a_window_announces_is_copied_to_its_first_lines_end_though_the_lm_refuses_it(tiny_lm):
    """After "...fail in a callback:" and the directive line under it, the example sits in the next
    chunk, its indentation cut away. The LM's check refuses all but its own best token (gamma 1):
    the example's first line is copied all the same, after a paragraph break, to its line's end;
    how far the copy goes on past it is the LM's to decide."""
    first = "Yes Parameters\n==============\n\nTo ask before a dangerous command, add a ``--yes`` flag and fail in a callback:\n\n.. code-block:: python"
    second = "@click.confirmation_option(prompt='Drop the db?')\n    def dropdb():\n        pass\n"
    cut = len(first) + len("\n\n    ")
    chunks = [Passage(id="opts#0", text=first, doc_id="opts"), Passage(id="opts#1", text=second, doc_id="opts", doc_char_start=cut)]
    out = _run_on_answer(tiny_lm, chunks, "How do I add a --yes flag so that a dangerous command asks first?", gamma=1.0)
    tail = out.text.split("fail in a callback:")[1]
    assert tail.startswith("\n\n@click.confirmation_option(prompt='Drop the db?')"), out.text
    copied = tail[2:]
    assert second.startswith(copied) and (copied == second or second[len(copied)] == "\n"), "whole lines of the example"
    assert "code-block" not in out.text and not any(model_written(out, span) for span in out.spans)


def test_a_copy_across_a_cut_inside_a_paragraph_copies_the_next_chunks_first_sentence_whole(tiny_lm):
    """The window "... as follows:" runs on: the line it announces is copied though the LM refuses
    it (gamma 1: all but its own best token). That line ends its chunk where the chunker cut a
    paragraph ("... arguments.  If you" | "also want ..."), and the copy goes on across the cut
    unchecked to the end of the next chunk's first sentence, not of its first line: the answer
    does not end on "If you"."""
    first = (
        "Combining\n=========\n\nTo merge the data files into one file, run the combine command as follows:\n\n"
        "The current directory isn't searched if you use command-line arguments."
    )
    second = "If you\nalso want data from the current directory, name it explicitly on the command\nline. Then run it again.\n"
    chunks = [Passage(id="cmb#0", text=first, doc_id="cmb"), Passage(id="cmb#1", text=second, doc_id="cmb", doc_char_start=len(first) + 2)]
    out = _run_on_answer(tiny_lm, chunks, "How do I merge the data files into one file with the combine command?", gamma=1.0)
    assert "as follows:\n\nThe current directory isn't searched if you use command-line arguments." in out.text, out.text
    assert out.text.rstrip().endswith("If you\nalso want data from the current directory, name it explicitly on the command\nline."), out.text
    assert not any(model_written(out, span) for span in out.spans), out.text


def test_a_copy_the_lm_refuses_mid_sentence_past_the_windows_ends_the_answer_on_the_last_whole_sentence(tiny_lm, monkeypatch):
    """Past its windows the answer runs on as far as the LM's check accepts the copy; a check
    that refuses it near its end (here: every draft but its last 3 tokens) leaves the answer on
    the last whole sentence it accepted, not on "... name it explicitly on the"."""
    monkeypatch.setattr(verifier_module, "accepted_prefix_length", lambda ratios, threshold: max(len(ratios) - 3, 0))
    text = (
        "Combining\n=========\n\nTo merge the data files into one file, run the combine command as follows::\n\n    $ coverage combine\n\n"
        "The current directory isn't searched if you use command-line arguments.  If you\nalso want data from the current "
        "directory, name it explicitly on the command\nline.\n"
    )
    out = _run_on_answer(tiny_lm, [Passage(id="cmb#0", text=text, doc_id="cmb")], "How do I merge the data files into one file with the combine command?", gamma=1e-6)
    assert "$ coverage combine" in out.text and out.text.rstrip().endswith("if you use command-line arguments."), out.text
    assert out.stats.finish_reason == "answered" and not any(model_written(out, span) for span in out.spans), out.text


def test_a_copy_the_lm_refuses_before_its_first_sentence_ends_finishes_that_sentence(tiny_lm, monkeypatch):
    """A check that refuses every draft token leaves a copy past the windows its first token alone
    (it passed the check by itself and is committed): the answer goes on to where that sentence of
    the source ends and stops there, rather than on "The"."""
    monkeypatch.setattr(verifier_module, "accepted_prefix_length", lambda ratios, threshold: 0)
    text = (
        "Combining\n=========\n\nTo merge the data files into one file, run the combine command as follows::\n\n    $ coverage combine\n\n"
        "The current directory isn't searched if you use command-line arguments.  If you\nalso want data from the current "
        "directory, name it explicitly on the command\nline.\n"
    )
    out = _run_on_answer(tiny_lm, [Passage(id="cmb#0", text=text, doc_id="cmb")], "How do I merge the data files into one file with the combine command?", gamma=1e-6)
    assert out.text.rstrip().endswith("$ coverage combine\n\nThe current directory isn't searched if you use command-line arguments."), out.text
    assert out.stats.finish_reason == "answered" and not any(model_written(out, span) for span in out.spans), out.text


def test_a_copy_running_on_past_the_windows_keeps_the_repeats_of_its_source(tiny_lm):
    """Documentation repeats its examples' first lines (`@click.command()` over each): a copy that
    goes on where the last one ended copies them as its source writes them, as a planned window
    does, rather than stopping mid-example where a 4-gram of the answer comes again."""
    text = (
        "Options\n=======\n\nTo add an option to a command, decorate it with the option::\n\n"
        "    @click.command()\n    @click.option('--count', default=1)\n    def hello(count):\n        pass\n\n"
        "A flag is an option that takes no value::\n\n"
        "    @click.command()\n    @click.option('--shout', is_flag=True)\n    def info(shout):\n        pass\n"
    )
    out = _run_on_answer(tiny_lm, [Passage(id="opt#0", text=text, doc_id="opt")], "How do I add an option to a command?", gamma=1e-6)
    assert "@click.option('--shout', is_flag=True)" in out.text, out.text
    assert not any(model_written(out, span) for span in out.spans), out.text


def test_a_copy_the_lm_refuses_inside_code_keeps_the_rule_for_copied_code(tiny_lm, monkeypatch):
    """Refused inside a code block (every draft but its last 8 tokens, mid-way through the
    example's last line), the copy is not cut back to the line end before: the rule for copied code
    goes on to the line's end, so the example keeps its last line."""
    monkeypatch.setattr(verifier_module, "accepted_prefix_length", lambda ratios, threshold: max(len(ratios) - 8, 0))
    first = "Registry\n========\n\nTo keep a registry of every subclass of a base class, define a hook like this:"
    second = "```python\nREGISTRY = []\nclass Base:\n    def __init_subclass__(cls):\n        REGISTRY.append(cls)\n```\n"
    chunks = [Passage(id="reg#0", text=first, doc_id="reg"), Passage(id="reg#1", text=second, doc_id="reg", doc_char_start=len(first) + 2)]
    out = _run_on_answer(tiny_lm, chunks, "How do I keep a registry of every subclass of a base class?", gamma=1e-6)
    assert "        REGISTRY.append(cls)\n```" in out.text, out.text
    assert not any(model_written(out, span) for span in out.spans), out.text


def test_a_draft_accepted_in_part_keeps_a_whole_prefix():
    ends = WholeEnds(sentences=frozenset({2, 4, 7}), code=frozenset())
    assert whole_prefix(5, ends) == 4, "up to the last sentence end within what the check accepted"
    assert whole_prefix(1, ends) == 2, "none within it: on to the end of the sentence the copy began"
    assert whole_prefix(5, WholeEnds(frozenset(), frozenset())) == 5, "no sentence ends in the draft: what the check accepted"
    code_first = WholeEnds(sentences=frozenset({9}), code=frozenset({3, 4, 5}))
    assert whole_prefix(4, code_first) == 4, "refused inside code: the rule for copied code finishes its line"
    assert whole_prefix(1, code_first) == 1, "code comes before the sentence's end: left to the rule for copied code"


@pytest.mark.parametrize("announced", ["::", ".. code-block:: console"], ids=["literal-block", "directive"])
def test_a_copy_into_a_chunk_cut_inside_code_goes_on_to_its_lines_end_though_the_lm_refuses_it(tiny_lm, announced):
    """A chunk cut inside a literal block opens with shell lines that read as text on their own
    (no prompt, no Python): read after the chunk before it, which announces the block, they are
    code. A copy running on into them that the LM's check would end mid-line goes on to the
    line's end, so no command is cut ("sudo chown root:root /usr/local/bin/")."""
    first = "Installing\n==========\n\nDrop the binary into your ``PATH`` and make it executable"
    first += "::" if announced == "::" else ":\n\n" + announced
    second = "    sudo cp borg-linux64 /usr/local/bin/borg\n    sudo chown root:root /usr/local/bin/borg\n    sudo chmod 755 /usr/local/bin/borg\n"
    cut = len(first) + len("\n\n")
    chunks = [Passage(id="inst#0", text=first, doc_id="inst"), Passage(id="inst#1", text=second, doc_id="inst", doc_char_start=cut)]
    # The LM's check (gamma 0.5) ends the copy on the second line, after "sudo chown root:".
    out = _run_on_answer(tiny_lm, chunks, "How do I install the binary so that I can run it?", gamma=0.5)
    copied = "".join(span.text for span in out.spans if span.copied and span.source.id == "inst#1")
    assert copied and second.startswith(copied) and (copied == second or second[len(copied)] == "\n"), out.text
    assert not any(model_written(out, span) for span in out.spans), out.text


def _accepting_decoder(tiny_lm, passages, max_new_tokens):
    """A nest decoder over ``passages`` (all retrieved) with an LM that accepts every copy."""
    store = TokenDatastore(passages, PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0, max_new_tokens=max_new_tokens)
    return NestDecoder(tiny_lm, store, ListRetriever(passages), NestConfig(**knobs), relevance=word_share)


def _two_window_answer(tiny_lm, passages, question, max_new_tokens=80):
    """The answer to ``question`` copied in two planned windows of ``passages`` (:func:`_accepting_decoder`)."""
    decoder = _accepting_decoder(tiny_lm, passages, max_new_tokens)
    return decoder.generate([{"role": "user", "content": question}], query=question, answer_windows=2)


@pytest.mark.parametrize("indent", ["", "    "], ids=["flush", "indented"])
def test_windows_that_would_run_into_each_other_get_a_paragraph_break_of_no_ones(tiny_lm, indent):
    """Two windows from passages of one paragraph each: nothing of either source separates them
    (a line's indentation does not: a chunk cut inside a block opens with it), so the decoder
    sets the LM's paragraph break between them: not copied, not the model's words."""
    body = Passage(id="body", text=f"{indent}The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients.")
    idle = Passage(id="idle", text="The `keepAliveTimeout` option sets how many milliseconds an idle socket stays open before it closes.")
    question = "How many milliseconds does an idle socket stay open, and which option sets the largest request body?"
    out = _two_window_answer(tiny_lm, [idle, body], question)
    copied = out.text.split("\n\n", 1)[1]
    assert out.text == f"{idle.text}\n\n{copied}" and body.text.endswith(copied) and copied.lstrip(" ") == body.text.lstrip(" "), out.text
    assert [(span.text, span.copied) for span in out.spans] == [(idle.text, True), ("\n\n", False), (copied, True)]
    assert out.stats.finish_reason == "answered" and not any(model_written(out, span) for span in out.spans)
    assert MODEL_MARK not in render_markdown(out) and MODEL_MARK not in render_html(out)


@pytest.mark.parametrize("middle", [0, 3], ids=["cut-once", "cut-four-times"])
def test_a_window_that_opens_inside_a_fenced_block_gets_its_opening_fence(tiny_lm, middle):
    """A chunker cut an example inside its fence: the next chunk opens with code and closes the
    block with a bare fence. A window copied from it is opened by the decoder with the block's
    fence (set, not copied, not the model's words: bare, without the source's ``js``), so a
    Markdown reader sees the copied lines as code and the source's closing fence as closing it,
    not opening a block. So also when the example is long and chunks of its middle, all code,
    stand between the fence and the window's chunk."""
    from markdown_it import MarkdownIt

    first = "The `listen` method starts the server. Create the app first:\n\n```js\nconst app = fastify()\n"
    lines = [f"app.register(plugin{i}, {{ prefix: '/v{i}' }})\n" for i in range(middle)]
    second = "app.listen({ port: 3000 })\n```\n\nThe server then listens on port 3000."
    opened = Passage(id="srv#0", doc_id="srv", text=first.rstrip("\n"))
    starts = [len(first) + len("".join(lines[:i])) for i in range(middle + 1)]
    between = [Passage(id=f"srv#{i + 1}", doc_id="srv", text=line.rstrip("\n"), doc_char_start=starts[i]) for i, line in enumerate(lines)]
    cut = Passage(id=f"srv#{middle + 1}", doc_id="srv", text=second, doc_char_start=starts[-1])
    out = _two_window_answer(tiny_lm, [cut, opened, *between], "How do I make the app listen on port 3000?", max_new_tokens=60)
    assert out.text.startswith("```\napp.listen({ port: 3000 })\n```\n\n"), out.text
    assert [(span.text, span.copied) for span in out.spans[:2]] == [("```\n", False), ("app.listen({ port: 3000 })\n```", True)]
    code = [t.content for t in MarkdownIt("commonmark").parse(out.text) if t.type == "fence"]
    assert code[0] == "app.listen({ port: 3000 })\n" and not any(model_written(out, span) for span in out.spans)


def test_a_fenced_window_after_prose_opens_its_fence_on_a_line_of_its_own(tiny_lm):
    """A window that opens inside a fenced block, planned after a window of prose that ends its
    sentence without a line break: the decoder's paragraph break, then the block's fence, then the
    copied lines, so a Markdown reader sees code, not a paragraph that runs on from the prose."""
    from markdown_it import MarkdownIt

    first = "Start the server with the `listen` method of the app:\n\n```js\nconst app = fastify()\n"
    second = "\napp.listen({ port: 3000 })\n```\n\nThe server then listens on port 3000."  # a splitter kept the line break
    opened = Passage(id="srv#0", doc_id="srv", text=first.rstrip("\n"))
    cut = Passage(id="srv#1", doc_id="srv", text=second, doc_char_start=len(first) - 1)
    body = Passage(id="body", text="The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients.")
    question = "Which option sets the largest request body in bytes that the server accepts, and how does the app listen on port 3000?"
    out = _two_window_answer(tiny_lm, [body, cut, opened], question, max_new_tokens=80)
    assert out.text.startswith(body.text + "\n\n```\napp.listen({ port: 3000 })\n```"), out.text
    code = [t.content for t in MarkdownIt("commonmark").parse(out.text) if t.type == "fence"]
    assert code[0] == "app.listen({ port: 3000 })\n" and not any(model_written(out, span) for span in out.spans)


@pytest.mark.parametrize(
    "announced",
    [
        "Run the command in a test with the runner, then check its exit code:\n\n.. code-block:: python",
        "Run the command in a test with the runner, then check its exit code as follows::",
    ],
    ids=["code-directive", "literal-block"],
)
def test_copied_code_indented_too_little_to_read_as_code_is_fenced_by_the_decoder(tiny_lm, announced):
    """A reStructuredText example under a code directive or a ``::`` paragraph, its body indented
    three spaces: copied as it is, a Markdown reader shows its lines as a paragraph. The copy that
    goes on into it (past the hidden directive line, or from the paragraph in one span) gets a
    fence above the code and another where the copy leaves it for the prose after (both set by
    the decoder: not copied, not the model's words), and the code's lines are the source's, read
    as one code block."""
    from markdown_it import MarkdownIt

    code = "   from click.testing import CliRunner\n   result = CliRunner().invoke(cli)\n   assert result.exit_code == 0"
    text = f"Testing\n=======\n\n{announced}\n\n{code}\n\nThe result also holds the output the command printed, as a string."
    decoder = _accepting_decoder(tiny_lm, [Passage(id="testing.rst", text=text)], 120)
    question = "How do I run a command in a test with the runner and check its exit code and output?"
    out = decoder.generate([{"role": "user", "content": question}], query=question, answer_windows=2)
    # The directive's line is hidden, and so is a paragraph's closing ``::`` (docutils shows one colon
    # of it, but the tokenizer holds both in one token).
    shown = announced.split("\n")[0].removesuffix("::")
    assert f"{shown}\n\n```\n{code}\n```\n\nThe result also holds" in out.text, out.text
    fences = [span.text for span in out.spans if not span.copied]
    assert fences == ["\n\n```\n  ", "\n```"], out.spans
    blocks = [t.content for t in MarkdownIt("commonmark").parse(out.text) if t.type == "fence"]
    assert blocks == [code + "\n"] and not any(model_written(out, span) for span in out.spans)


@pytest.mark.parametrize(
    ("item", "body", "fenced"),
    [
        ("1. Download the release and check its version:\n\n.. code::", "    $ quill version\n    quill 0.12.1 compiled with go1.16.6", True),
        ("- Download the release and check its version:", "      $ quill version\n      quill 0.12.1 compiled with go1.16.6", False),
    ],
    ids=["indented-four-under-a-list-item", "indented-past-the-items-text"],
)
def test_copied_code_under_a_list_item_is_fenced_where_the_answer_would_read_it_as_prose(tiny_lm, item, body, fenced):
    """Code indented four spaces after a list item's text (a reStructuredText directive's body
    under a numbered step) reads as the item's next paragraph in a Markdown answer: the copy that
    goes on into it gets the decoder's fences, and the step after it follows the closing fence.
    Code indented four columns past the item's text reads as code in the item: no fence."""
    from markdown_it import MarkdownIt

    text = f"Reproducing a build\n===================\n\n{item}\n\n{body}\n\n2. Unpack the source code into a folder of its own."
    decoder = _accepting_decoder(tiny_lm, [Passage(id="build.rst", text=text)], 120)
    question = "How do I download the release and check its version before I unpack the source code?"
    out = decoder.generate([{"role": "user", "content": question}], query=question, answer_windows=2)
    tokens = MarkdownIt("commonmark").parse(out.text)
    code = [t.content for t in tokens if t.type in ("fence", "code_block")]
    assert "quill 0.12.1 compiled" in out.text and "2. Unpack the source code" in out.text, out.text
    assert code == [(body if fenced else textwrap.dedent(body)) + "\n"], out.text
    assert ("```" in out.text) is fenced and not any(model_written(out, span) for span in out.spans)


def test_a_code_block_a_window_leaves_open_is_closed_before_the_next_window(tiny_lm):
    """A chunker cut a long example inside its fence: the window copied from that chunk ends in
    the code. Before the next window opens, the decoder closes the block with its fence (set, not
    copied, not the model's words), so what follows does not read as code."""
    code = Passage(id="srv#0", doc_id="srv", text="The `keepAliveTimeout` option sets how long an idle socket stays open:\n\n```js\nconst app = fastify({ keepAliveTimeout: 5000 })")
    body = Passage(id="body", text="The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients.")
    question = "How long does an idle socket stay open with keepAliveTimeout, and which option sets the largest request body?"
    out = _two_window_answer(tiny_lm, [code, body], question, max_new_tokens=120)
    assert "keepAliveTimeout: 5000 })\n```\n\nThe `bodyLimit` option" in out.text, out.text
    assert ("```", False) in [(span.text.strip(), span.copied) for span in out.spans], out.spans
    assert not any(model_written(out, span) for span in out.spans) and out.attribution_ratio < 1.0


@pytest.mark.parametrize(
    "block",
    [
        "```js\nparse(args, (err, argv, output) => bot.respond(output))\n```",
        "::\n\n    parse(args, (err, argv, output) => bot.respond(output))",
        ".. code-block:: js\n\n    // capture the output in a callback\n    parse(args, (err, argv, output) => bot.respond(output))",
    ],
    ids=["fenced", "indented", "directive-body-alone"],
)
def test_a_window_after_copied_code_opens_a_line_of_its_own(tiny_lm, block):
    """A window from elsewhere after one that ends in code (a closing fence, a line of an
    indented block) gets the paragraph break though it opens with white space: on a fence's line
    it keeps the block open in a Markdown reader, on a code line it reads as more code. A code
    directive's body copied without its directive line is code in its source though the answer's
    text alone reads it as a paragraph."""
    code = Passage(id="cb", text=block if block.startswith("..") else f"Capture the output in a callback:\n\n{block}")
    # The second window opens after "2.", with the white space before `argv` (a numbered list
    # item's marker ends the sentence before it).
    body = Passage(id="out", text="The callback receives:\n\n1. `err`: a validation error.\n2. `argv`: the parsed arguments.\n3. `output`: any text that would have been printed.")
    question = "How do I capture the output in a callback, and what does the output argument hold?"
    out = _two_window_answer(tiny_lm, [code, body], question)
    assert "bot.respond(output))" in out.text and " `argv`: the parsed arguments." in out.text, out.text
    spans = [(span.text, span.copied) for span in out.spans]
    code_at = next(i for i, (text, copied) in enumerate(spans) if copied and "bot.respond" in text)
    assert spans[code_at + 1] == ("\n\n", False), out.spans
    assert not any(model_written(out, span) for span in out.spans)


def test_an_answer_ends_answered_when_the_lm_refuses_the_next_window(tiny_lm):
    """After a window that closes an answer, an LM token where the next window should open ends
    the answer: what was copied stands, and the LM does not write on to the token limit."""
    from nest_integrations.decoding.generation import Generation
    from nest_integrations.decoding.spans import TokenRecord

    verifier = NestDecoder(tiny_lm).verifier
    gen = Generation(config=NestConfig(max_new_tokens=80))
    verifier.commit(gen, [TokenRecord(5)])  # an LM token in the middle of an answer is kept
    assert gen.ids == [5] and not gen.finished
    gen.plan.between_windows = True
    verifier.commit(gen, [TokenRecord(6)])
    assert gen.finished and gen.stats.finish_reason == "answered" and gen.ids == [5]


def test_the_model_writes_nothing_in_a_planned_answer(tiny_lm):
    """Past its planned windows (a last window that runs on, a copy that cannot go on) an answer
    ends where the model would write its own words; with check_answer_windows the LM writes on."""
    from nest_integrations.decoding.copy_plan import CopyPlan
    from nest_integrations.decoding.spans import TokenRecord
    from nest_integrations.decoding.generation import Generation

    verifier = NestDecoder(tiny_lm).verifier
    gen = Generation(config=NestConfig(max_new_tokens=80), plan=CopyPlan(whole=True))
    verifier.commit(gen, [TokenRecord(5, 0, 0), TokenRecord(7, 0, 1)])
    verifier.commit(gen, [TokenRecord(6)])
    assert gen.finished and gen.stats.finish_reason == "answered" and gen.ids == [5, 7]
    body = "The `bodyLimit` option sets the largest request body, in bytes, that the server accepts. Example:"
    doc = Passage(id="srv", title="Server", text=f"## Options\n\n{body}")
    store = TokenDatastore([doc], PassageEncoder(tiny_lm))
    decoder = NestDecoder(tiny_lm, store, ListRetriever([doc]), relevance=word_share)
    question = "Which option sets the largest request body the server accepts?"
    for check, written in ((False, False), (True, True)):
        out = decoder.generate([{"role": "user", "content": question}], query=question, mode="nest", max_new_tokens=60,
                               min_passage_relevance=-1.0, check_answer_windows=check, stop_at_source_end=False)
        assert any(not span.copied for span in out.spans) == written, out.spans


def test_the_line_break_under_a_copied_title_is_copied_unchecked_like_the_title(tiny_lm):
    """An LM that weighs the datastore at nothing (alpha -5) and refuses every token it would not
    write itself (gamma 1) still copies the section's title and the line break that sets the
    window below it; the window's words it refuses only when asked to check them
    (``check_answer_windows``); by default the planned window is copied whole."""
    body = "The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients."
    idle = "The `keepAliveTimeout` option sets how many milliseconds an idle socket stays open before it closes."
    unrelated = "Unrelated words about the logging levels and the colours of the terminal go here."
    doc = Passage(id="srv", title="Server", text=f"## Options\n\n{body}\n\n{unrelated}\n\n{idle}\n")
    store = TokenDatastore([doc], PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=-5.0, tau=0.1, delta=1.0, gamma=1.0, min_passage_relevance=-1.0, max_new_tokens=30)
    decoder = NestDecoder(tiny_lm, store, ListRetriever([doc]), NestConfig(**knobs), relevance=word_share)
    question = "How many milliseconds does an idle socket stay open, and which option sets the largest request body?"

    def copied_prefix(**overrides):
        out = decoder.generate([{"role": "user", "content": question}], query=question, **overrides)
        prefix = ""
        for span in out.spans:
            if not span.copied:
                break
            prefix += span.text
        return prefix

    checked = copied_prefix(check_answer_windows=True)
    assert checked.startswith(" Options\n\n"), checked
    assert not checked.startswith(f" Options\n\n{idle}"), "the window's words are checked"
    assert copied_prefix().startswith(f" Options\n\n{idle}"), "a planned window is copied whole"


@pytest.mark.parametrize(
    "before", ["", "Sizes and limits of the server.\n\n", "Sizes and limits of the server.\n"],
    ids=["first-heading", "later-heading", "heading-right-under-a-line"],
)
def test_a_sections_title_after_a_copy_opens_a_line_of_its_own(tiny_lm, before):
    """The second window sits in another section: its title label (" Limits", read after the
    heading's marks, a space first) goes on a line of its own, after a blank line, not onto the
    end of the first window ("...before it closes. Limits") nor on the line right under it,
    where Markdown reads it as that paragraph's last line. A later heading's label is copied from
    the line breaks before it: two are break enough, one gets a second from the decoder."""
    idle = "The `keepAliveTimeout` option sets how many milliseconds an idle socket stays open before it closes."
    body = "The `bodyLimit` option sets the largest request body, in bytes, that the server accepts from clients."
    first = Passage(id="timeouts", title="Server", text=f"{idle}\n")
    second = Passage(id="limits", title="Server", text=f"{before}## Limits\n\n{body}\n")
    question = "How many milliseconds does an idle socket stay open, and which option sets the largest request body?"
    out = _two_window_answer(tiny_lm, [first, second], question, max_new_tokens=90)
    assert out.text.startswith(f"{idle}\n\n"), out.text
    assert "Limits" in out.text and "closes. Limits" not in out.text and "\n\n\n" not in out.text, out.text
    assert re.search(r"\n[ \t]*\n[ \t]*Limits", out.text), out.text
    assert not any(model_written(out, span) for span in out.spans)


CODE_DOC = Passage(
    id="guide.md",
    text="# Guide\n\nInstall the tool, then run it:\n\n```sh\nquill build --out site --verbose\nquill serve --port 8080\n```\n\nThe server stops on Ctrl-C.\n",
    metadata={"source": "guide.md"},
)


def _copied_to(decoder, passage, char):
    """A generation that has copied ``passage`` from its start up to the token ending at ``char``."""
    from nest_integrations.decoding.generation import Generation
    from nest_integrations.decoding.spans import TokenRecord

    pidx = decoder.datastore.add(passage)
    candidates = decoder.datastore.candidates([pidx])
    encoded = candidates.passage(pidx)
    last = int((encoded.char_spans[:, 1] <= char).sum()) - 1
    gen = Generation(config=NestConfig(), candidates=candidates)
    decoder.verifier.commit(gen, [TokenRecord(int(encoded.token_ids[i]), pidx, i) for i in range(last + 1)])
    return gen, pidx, encoded


def test_the_lm_never_writes_inside_copied_code(tiny_lm):
    """Mid-line in copied code the copy goes on to the line's end; at a line's end the block's
    own closing fence is copied and the answer ends: no model text inside the source's code."""
    decoder = NestDecoder(tiny_lm, TokenDatastore([], PassageEncoder(tiny_lm)))
    text = CODE_DOC.text
    gen, pidx, encoded = _copied_to(decoder, CODE_DOC, text.index("--out"))
    proposer = decoder.speculation.proposer
    proposal = proposer._inside_copied_code(gen)
    copied = [proposal.first, *proposal.draft]
    assert all(r.passage_index == pidx for r in copied) and proposal.unchecked
    assert text[encoded.char_spans[copied[0].position, 0] : encoded.char_spans[copied[-1].position, 1]] == " --out site --verbose"
    decoder.verifier.commit(gen, copied)
    proposal = proposer._inside_copied_code(gen)  # at the line's end: the fence closes the block
    decoder.verifier.commit(gen, [proposal.first, *proposal.draft])
    assert gen.finished and gen.stats.finish_reason == "answered"
    assert gen.text.endswith("quill build --out site --verbose\n```")
    assert all(r.passage_index is not None for r in gen.records)
    # Outside code the rule does nothing; an indented block, which no fence closes, ends at the line's end.
    prose, _, _ = _copied_to(decoder, CODE_DOC, text.index("then"))
    assert proposer._inside_copied_code(prose) is None and not prose.finished
    indented = Passage(id="ind.md", text="# Run\n\nType:\n\n    quill build\n    quill serve\n\nDone.\n")
    gen, _, _ = _copied_to(decoder, indented, indented.text.index("build") + len("build"))
    proposer._inside_copied_code(gen)
    assert gen.finished and gen.stats.finish_reason == "answered" and gen.text.endswith("quill build")


def test_no_span_from_another_source_is_spliced_into_copied_code(tiny_lm):
    """Mid-line in copied code the copy goes on from its own source, though a neighbour in another
    passage goes on from the same words (one example's ``C(x=`` went on with another's ``42)``)."""
    from nest_integrations.decoding.generation import Generation
    from nest_integrations.decoding.mixing import Mixture
    from nest_integrations.decoding.proposal import Verdict
    from nest_integrations.decoding.spans import TokenRecord

    decoder = NestDecoder(tiny_lm, TokenDatastore([], PassageEncoder(tiny_lm)))
    other = Passage(id="publish.md", text="To publish elsewhere, run quill build --out public and upload the folder.")
    pidx, oidx = decoder.datastore.add(CODE_DOC), decoder.datastore.add(other)
    candidates = decoder.datastore.candidates([pidx, oidx])
    encoded, elsewhere = candidates.passage(pidx), candidates.passage(oidx)
    last = int((encoded.char_spans[:, 1] <= CODE_DOC.text.index(" --out")).sum()) - 1  # "...quill build"
    gen = Generation(config=NestConfig(), candidates=candidates)
    decoder.verifier.commit(gen, [TokenRecord(int(encoded.token_ids[i]), pidx, i) for i in range(last + 1)])
    there = int((elsewhere.char_spans[:, 1] <= other.text.index(" --out")).sum())  # its " --out", after "quill build"
    entry = int(np.flatnonzero((candidates.passage_index == oidx) & (candidates.positions == there))[0])
    vocabulary = tiny_lm.model.config.vocab_size
    mixture = Mixture(  # the LM indifferent, the neighbour's weight whole: a span elsewhere would be taken
        p_m=torch.full((1, vocabulary), 1.0 / vocabulary), lam=torch.zeros(1),
        values=torch.tensor([[int(elsewhere.token_ids[there])]]), entries=torch.tensor([[entry]]), ratio=torch.ones(1),
    )
    proposal = decoder.speculation.proposer.propose(gen, Verdict(mixture), None)
    copied = [proposal.first, *proposal.draft]
    assert {r.passage_index for r in copied} == {pidx} and proposal.unchecked
    assert "".join(tiny_lm.tokenizer.decode([r.token_id]) for r in copied) == " --out site --verbose"


LONG_EXAMPLE = Passage(
    id="hooks.md",
    text="The `onRequest` hook runs before the body is parsed; register it on the instance:\n\n```js\n"
    + "".join(f"fastify.addHook('onRequest', async (request, reply) => {{ request.log.info('step {i}') }})\n" for i in range(6))
    + "```\n",
)


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "indented"])
def test_a_budget_that_ends_inside_copied_code_ends_at_a_line_end_with_the_block_closed(tiny_lm, fenced):
    """Whatever the token budget, an answer that copies a long example does not end inside it:
    the copy stops at the last line end from which the budget can still close the block, and the
    decoder's closing fence (not copied, not the model's words) is the answer's last line; an
    indented block, which no fence closes, ends at a line end. A budget that ends there cut a line
    ("rv = click.Group.get_command(self, ctx,") and left the block open to the answer's end."""
    from nest_integrations.corpus.markdown_structure import unclosed_fence

    text = LONG_EXAMPLE.text if fenced else "# Hooks\n\n" + LONG_EXAMPLE.text.replace("```js\n", "").replace("```\n", "").replace("\nfastify", "\n    fastify")
    example = Passage(id="hooks.md", text=text)
    lines = set(text.splitlines())
    question = "How do I register an onRequest hook that runs before the body is parsed?"
    for budget in range(40, 140, 7):
        out = _two_window_answer(tiny_lm, [example], question, max_new_tokens=budget)
        assert unclosed_fence(out.text) is None, (budget, out.text)
        shown = out.text[: -len("\n```")] if fenced and out.text.endswith("\n```") else out.text
        assert all(line in lines or not line for line in shown.strip("\n").splitlines()[1:]), (budget, out.text)
        assert not any(model_written(out, span) for span in out.spans)
        if out.stats.finish_reason == "length" and "fastify.addHook" in out.text:
            assert out.text.endswith(")\n```" if fenced else ")"), (budget, out.text)
            assert out.spans[-1].copied != fenced and out.stats.new_tokens <= budget
    # A stream sends the same answer, the decoder's fence with the last chunk.
    decoder = _accepting_decoder(tiny_lm, [example], 61)
    messages = [{"role": "user", "content": question}]
    full = decoder.generate(messages, query=question, answer_windows=2)
    chunks = list(decoder.stream(messages, query=question, answer_windows=2))
    assert "".join(c.text for c in chunks) == full.text and merge_spans([s for c in chunks for s in c.spans]) == full.spans


def test_an_answer_that_ends_inside_a_block_its_chunk_cut_gets_the_closing_fence(tiny_lm):
    """A planned answer that ends where its copy does, inside a fenced block whose chunk a chunker
    cut before the closing fence, ends with that fence on a line of its own: set by the decoder
    (not copied, not the model's words), so a reader of the raw text sees the code end. Outside a
    fence, or in a mode that copies nothing, the text is left as it is."""
    from nest_integrations.decoding.output import NestOutput

    cut = Passage(id="hooks.md#3", text="Register it on the instance:\n\n```js\nfastify.addHook('onRequest', handler)\nfastify.listen({ port: 3000 })")
    decoder = NestDecoder(tiny_lm, TokenDatastore([], PassageEncoder(tiny_lm)))
    gen, _, _ = _copied_to(decoder, cut, len(cut.text))
    gen.finish("answered")
    decoder.verifier.close(gen)
    assert gen.text == cut.text + "\n```" and gen.records[-1].separator
    output: NestOutput = gen.output(decoder.datastore.passages)
    assert [(span.text, span.copied) for span in output.spans] == [(cut.text, True), ("\n```", False)]
    assert not any(model_written(output, span) for span in output.spans)
    prose, _, _ = _copied_to(decoder, CODE_DOC, CODE_DOC.text.index("then"))
    prose.finish("answered")
    before = prose.text
    decoder.verifier.close(prose)
    assert prose.text == before
    base, _, _ = _copied_to(decoder, cut, len(cut.text))
    base.config = NestConfig(mode="base")
    base.finish("eos")
    decoder.verifier.close(base)
    assert not base.text.endswith("```")


def test_a_window_that_goes_on_from_a_better_one_is_copied_with_it():
    """The sentence right after the best window is copied straight after it, in the source's
    order, not after the second window; a window that ends where a better one starts keeps its
    place, and windows of other passages are left alone."""
    from nest_integrations.decoding.prepare import join_touching
    from nest_integrations.policy.copy_policy import Window

    text = "Lead in. First one. Goes on.\n\nOther words. Last one."
    first, goes_on = Window("p", 9, 19, 0.9), Window("p", 20, 28, 0.4)
    last, lead_in, elsewhere = Window("p", 43, 52, 0.6), Window("p", 0, 8, 0.3), Window("q", 0, 8, 0.5)
    assert [text[w.start : w.end] for w in (first, goes_on, last, lead_in)] == ["First one.", "Goes on.", "Last one.", "Lead in."]
    joined = join_touching([first, last, elsewhere, goes_on, lead_in], lambda passage_id: text)
    assert joined == [Window("p", 9, 28, 0.9), last, elsewhere, lead_in]
    # One that does not close an answer ("as follows:") stays apart: joined, the windows after it would be dropped.
    unfinished = "First one. As follows:\n\nOther words."
    opening, follows = Window("p", 0, 10, 0.9), Window("p", 11, 22, 0.4)
    assert [unfinished[w.start : w.end] for w in (opening, follows)] == ["First one.", "As follows:"]
    assert join_touching([opening, follows], lambda passage_id: unfinished) == [opening, follows]
    # One that announces a better one's example is copied before it, as one: else it would run on into the example copied already.
    literal = "Lead in.\n\nRun it in the following way\n\n::\n\n    $ ionice -c2 restic backup\n\nOther words."
    example, announcing = Window("p", literal.index("    $"), literal.index("backup") + 6, 0.9), Window("p", 10, 37, 0.4)
    assert literal[announcing.start : announcing.end] == "Run it in the following way"
    assert join_touching([example, announcing], lambda passage_id: literal) == [Window("p", 10, example.end, 0.9)]
    assert join_touching([Window("p", 0, 8, 0.9), announcing], lambda passage_id: literal)[1] == announcing, "announcing nothing planned: apart"


def test_a_planned_copy_that_runs_on_ends_no_answer_at_its_windows_end():
    """A window that does not close an answer is copied whole to its end, then the copy runs on
    (no planned copy any more: the LM checks it and source ends apply); one that closes an
    answer moves on to the next, and after the last the answer is done."""
    from nest_integrations.decoding.copy_plan import CopyPlan

    plan = CopyPlan.of_copies([((0, 3), (0, 9), False, False), ((1, 0), (1, 5), False, True)], whole=True)
    assert plan.take_opening() == (0, 3) and plan.copies_whole(0, 9) and not plan.copies_whole(0, 10)
    assert plan.next_copy() and plan.take_opening() == (1, 0) and plan.window_end == (1, 5) and plan.runs_on
    assert plan.next_copy() and plan.window_end is None and not plan.copies_whole(1, 6) and plan.take_opening() is None
    assert not plan.next_copy(), "past a copy that ran on, nothing is planned"


def test_a_paragraph_break_that_nothing_follows_is_dropped_and_never_streamed(tiny_lm):
    """A break set before a copy the LM then refuses separates nothing: the answer ends without
    it, and the stream holds it back until what follows it is committed."""
    from nest_integrations.decoding.generation import Generation
    from nest_integrations.decoding.spans import TokenRecord

    from nest_integrations.decoding.proposer import paragraph_break_id

    verifier, break_id = NestDecoder(tiny_lm).verifier, paragraph_break_id(tiny_lm.tokenizer)
    word = tiny_lm.tokenizer(" Done.", add_special_tokens=False)["input_ids"]
    gen = Generation(config=NestConfig(max_new_tokens=80))
    verifier.commit(gen, [TokenRecord(t) for t in word] + [TokenRecord(break_id, separator=True)])
    assert gen.text == " Done.\n\n" and gen.stable_length() == len(" Done.")
    gen.plan.whole = True  # a planned answer: the model writes nothing in it
    verifier.commit(gen, [TokenRecord(5)])  # the LM's own token where the copy should go on
    assert gen.finished and gen.stats.finish_reason == "answered"
    assert gen.text == " Done." and gen.ids == word and not any(r.separator for r in gen.records)
    # A code line's indentation set after the break, for a copy the budget then leaves out, goes with it.
    indentation = tiny_lm.tokenizer("   ", add_special_tokens=False)["input_ids"]
    gen = Generation(config=NestConfig(max_new_tokens=80))
    verifier.commit(gen, [TokenRecord(t) for t in word] + [TokenRecord(t, separator=True) for t in [break_id, *indentation]])
    gen.finish("length")
    assert gen.text == " Done." and gen.ids == word


def test_a_copy_going_on_past_a_paragraphs_closing_colons_copies_the_line_they_announce(tiny_lm, monkeypatch):
    """A paragraph's closing ``::`` is markup a copy skips ("try::" reads "try": the tokenizer holds
    both colons in one token), so a copy checked by the LM ends there. An LM that refuses a line
    break after text (as SmolLM refuses one after "... systems, try") ended the answer at the
    announcement; the source goes on there as after a break, and the example's first line is
    copied unchecked."""
    lm_check = proposer_module.relaxed_accept_ratio

    def refuse_line_breaks(p_m, ids, gamma):
        opens_line = tiny_lm.tokenizer.decode([int(ids[0])]).startswith("\n")
        return torch.zeros(1) if opens_line else lm_check(p_m, ids, gamma)

    monkeypatch.setattr(proposer_module, "relaxed_accept_ratio", refuse_line_breaks)
    text = (
        "Installation\n============\n\nborg is packaged for most distributions. For most POSIX-like systems, try::\n\n"
        "    $ pip install borgbackup\n\nThen check the version it installed.\n"
    )
    chunks = [Passage(id="inst#0", text=text, doc_id="inst")]
    store = TokenDatastore(chunks, PassageEncoder(tiny_lm))
    knobs = dict(mode="nest", alpha=-5.0, tau=0.1, delta=1.0, gamma=1e-6, min_passage_relevance=-1.0, max_new_tokens=40)
    decoder = NestDecoder(tiny_lm, store, ListRetriever(chunks), NestConfig(**knobs, check_answer_windows=True), relevance=word_share)
    question = "How do I install borg on a POSIX-like system?"
    out = decoder.generate([{"role": "user", "content": question}], query=question)
    assert "For most POSIX-like systems, try\n\n    $ pip install borgbackup" in out.text, out.text
    assert [span.text for span in out.spans if span.copied][-1] == "\n\n    $ pip install borgbackup", out.spans
