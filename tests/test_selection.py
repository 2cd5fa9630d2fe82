"""The answer selector: which windows of the retrieved passages a question's answer copies."""

import re

import numpy as np
import pytest

from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.selection import DEFAULT_SELECTOR, FEATURES, AnswerSelector, candidate_windows, window_features
from conftest import word_share


def chosen(query: str, passages: list[Passage], similarity=word_share, count: int = 1, **kwargs) -> list[str]:
    by_id = {p.id: p for p in passages}
    return [by_id[w.passage_id].text[w.start : w.end] for w in DEFAULT_SELECTOR.select(query, passages, similarity, count=count, **kwargs)]


def test_the_window_that_answers_is_chosen():
    doc = Passage(id="gen", text="Generators are iterators. The send() method resumes the generator and sends a value "
                  "into it. The close() method raises GeneratorExit inside the generator.")
    assert chosen("How do I send a value into a generator?", [doc])[0].startswith("The send() method")
    shutil = Passage(id="shutil", text="copy2(src, dst)\nCopy data and metadata.\n\nrmtree(path, ignore_errors=False)\n"
                     "Recursively delete a directory tree and everything in it.")
    assert chosen("How do I delete a directory and everything in it?", [shutil])[0].startswith("rmtree(path"), "with the line that heads it"


def test_a_follow_up_is_answered_by_what_it_asks_now():
    hooks = Passage(id="hooks", text="Use fastify.addHook(name, fn) to add a function to the lifecycle, and check the hooks page.")
    decorators = Passage(id="deco", text="Use fastify.hasDecorator(name) to check for the existence of a decoration.")
    query = "How do I add a utility function to the Fastify instance?\nHow do I check later that it exists?"
    cosines = {(query, "hooks"): 0.5, (query, "deco"): 0.45, (query.splitlines()[-1], "hooks"): 0.0, (query.splitlines()[-1], "deco"): 0.9}

    def similarity(q: str, texts: list[str]) -> list[float]:
        return [cosines.get((q, "hooks" if "addHook" in t else "deco"), 0.0) for t in texts]

    assert "hasDecorator" in chosen(query, [hooks, decorators], similarity)[0]


def test_a_markdown_window_takes_in_its_whole_paragraph_under_its_section_title():
    """The sentence sharing the question's words leans on the one before it for the answer."""
    doc = Passage(id="s", text=(
        "## Routing\n\nPaths like `/foo` and `/foo/` are different. If you want to change this, set "
        "`ignoreTrailingSlash` to `true`. That way, both `/foo` and `/foo/` will point to the same route.\n\n"
        "Another paragraph about something else entirely.\n"
    ))
    text = chosen("How do I make /foo and /foo/ point to the same route?", [doc])[0]
    assert "ignoreTrailingSlash" in text and text.endswith("the same route.") and "Another" not in text
    assert {c.title for c in candidate_windows([doc]) if c.start > 0} == {"Routing"}
    prose = Passage(id="p", text=doc.text.replace("## Routing\n\n", ""))
    assert "Paths like" not in chosen("How do I make /foo and /foo/ point to the same route?", [prose])[0], "prose keeps its sentence windows"


def test_no_window_spans_a_heading():
    """A heading's line is never copied: a window over one was chosen for words the answer does
    not show (the last list item of one section, copied for the title of the next)."""
    doc = Passage(id="faq", text=(
        "Protecting backups\n------------------\n\nThus:\n\n- have multiple backup media\n"
        "- have a relatively recent backup on your media\n\n"
        "How do I report a security issue?\n---------------------------------\n\n"
        "Send a private email to the security contact.\n\n"
        ".. _compaction:\n\nSeparate compaction\n-------------------\n\nBorg does not compact segments on its own.\n"
    ))
    headings = [m.start() for m in re.finditer(r"^\w.*\n-+$", doc.text, re.M)]
    candidates = candidate_windows([doc])
    assert not [doc.text[c.start : c.end] for c in candidates if any(c.start < h < c.end for h in headings)]
    assert not [c for c in candidates if "recent backup" in doc.text[c.start : c.end] and "secur" in c.words]
    below = [c for c in candidates if "compact segments" in doc.text[c.start : c.end]]
    assert below and all(c.heading_path == ("Separate compaction",) for c in below), "a label before a title is no section of its own"
    assert chosen("How do I report a security issue?", [doc])[0].endswith("Send a private email to the security contact.")


def test_windows_never_repeat_one_another_through_overlapping_chunks():
    sentence = "Be aware that if routes are wrapped with fastify-plugin, the prefix option will not work."
    lead = "Register routes with a prefix option. "
    first = Passage(id="a#0", text=f"{lead}{sentence}", doc_id="a", doc_char_start=0)
    second = Passage(id="a#1", text=f"{sentence} Wrap a plugin in a plugin to make the prefix option work.", doc_id="a", doc_char_start=len(lead))
    question = "Does the prefix option work when routes are wrapped with fastify-plugin?"
    texts = chosen(question, [first, second], count=2)
    assert len(texts) == 2 and sum(sentence in text for text in texts) == 1, texts
    assert chosen("   ", [first]) == [] and chosen(question, []) == []


def test_an_example_two_pages_repeat_is_chosen_once():
    example = "```js\nyargs(process.argv.slice(2))\n  .onFinishCommand(async (resultValue) => {\n    await db.disconnect()\n  }).argv\n```"
    api = Passage(id="api", text=f"## .onFinishCommand([handler])\n\nCalled after the completion of any command:\n\n{example}\n")
    advanced = Passage(id="advanced", text=f"### Example\n\n{example.replace('  ', '    ')}\n")
    texts = chosen("When is the onFinishCommand handler called after a command completes?", [api, advanced], count=3)
    assert sum("db.disconnect()" in text for text in texts) == 1, texts


def test_features_have_one_column_each_and_the_selector_checks_its_weights():
    doc = Passage(id="d", text="## Options\n\nSet `timeout` to change how long a request may take. The default is 30 seconds.")
    candidates = candidate_windows([doc])
    features = window_features("What is the default timeout?", candidates, [doc], word_share)
    assert features.shape == (len(candidates), len(FEATURES)) and features.dtype == np.float32
    assert np.all(np.isfinite(features)) and features[:, FEATURES.index("first_stage_rank")].max() == 1.0
    probabilities = DEFAULT_SELECTOR.probabilities(features)
    assert np.all((probabilities > 0) & (probabilities < 1))
    with pytest.raises(ValueError, match="weights"):
        AnswerSelector(weights=(1.0,), bias=0.0)


def test_windows_of_a_passage_that_never_names_the_person_asked_about_are_not_chosen():
    """The answer about William Blake copies his summary, not William the Silent's sentence that
    shares the question's words ("national"): the gate's names rule holds for the windows too,
    and the windows left are ranked as without the rule."""
    from nest_integrations.core.config import NestConfig
    from nest_integrations.decoding.prepare import choose_answer_windows

    silent = Passage(id="silent", text="William the Silent is named in the Dutch national anthem. He led the Dutch revolt.")
    blake = Passage(id="blake", text="William Blake was an English poet, painter and printmaker. He lived in London.")
    query = "What nationality was William Blake?"
    assert chosen(query, [silent, blake])[0].startswith("William the Silent")  # the selector alone

    def tokens_of(passage_id: str) -> tuple[str, np.ndarray]:
        text = {p.id: p.text for p in (silent, blake)}[passage_id]
        return text, np.array([[m.start(), m.end()] for m in re.finditer(r"\S+", text)])

    windows = choose_answer_windows(query, [silent, blake], word_share, NestConfig(), tokens_of)
    assert windows and {w.passage_id for w in windows} == {"blake"}
    named = DEFAULT_SELECTOR.select(query, [silent, blake], word_share, count=3, eligible=lambda p: p.id == "blake")
    everything = DEFAULT_SELECTOR.select(query, [silent, blake], word_share, count=6)
    assert named == [w for w in everything if w.passage_id == "blake"][:3]
