"""Seams (where a copy may start), answer windows, and the conversation's retrieval query."""

from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.conversation import is_follow_up, retrieval_query
from nest_integrations.policy.copy_policy import acceptable_start, closes_answer, focus_window, focus_windows, is_question, naming_words, sentence_starts, wants_focus

ADA = (
    "Augusta Ada King, Countess of Lovelace (née Byron; 10 December 1815 – 27 November 1852) was an English "
    "mathematician. She is chiefly known for her work on the Analytical Engine."
)


def _ok(generated: str, at: str) -> bool:
    return acceptable_start(generated, ADA, ADA.index(at), sentence_starts(ADA))


def test_copies_start_at_sentences_after_a_finished_sentence():
    assert _ok("", "Augusta") and _ok("Here is her bio.", " She is chiefly")
    assert not _ok("", " was an English"), "an answer does not open mid-sentence"
    assert not _ok("Ada Lovelace", " She is chiefly"), "a new sentence cannot continue an unfinished one"


def test_mid_sentence_copies_must_continue_the_text_so_far():
    assert _ok("She was the Countess of Lovelace", " (née")
    assert not _ok("Ada Lovelace", ", Countess"), "', Countess' after a name the source does not have"
    assert not _ok("Byron; 10 December", " 1815"), "inside a parenthesis the text never opened"
    assert _ok("(née Byron; 10 December", " 1815")


def test_questions_focus_on_the_answering_sentence():
    doc = Passage(id="gen", text="Generators are iterators. The send() method resumes the generator and sends a value "
                  "into it. The close() method raises GeneratorExit inside the generator.")
    window = focus_window("How do I send a value into a generator?", [doc])
    assert window is not None and doc.text[window.start:window.end].startswith("The send() method")
    assert focus_window("zzz qqq?", [doc]) is None
    assert is_question("what is a generator") and not is_question("Tell me a bio of Ada Lovelace.")
    assert not wants_focus("Marie Curie") and wants_focus("When was Marie Curie born?")


def test_follow_ups_take_the_earlier_question_along():
    history = [
        {"role": "user", "content": "What is a generator in Python?"},
        {"role": "assistant", "content": "A function that yields values."},
        {"role": "user", "content": "And how do I send a value into it?"},
    ]
    assert retrieval_query(history) == "What is a generator in Python?\nAnd how do I send a value into it?"
    fresh = history + [{"role": "user", "content": "Which module parses command-line arguments in Python?"}]
    assert retrieval_query(fresh) == fresh[-1]["content"]
    assert retrieval_query([{"role": "system", "content": "Be brief."}]) == ""
    assert is_follow_up("why?") and not is_follow_up("Which module parses command-line arguments in Python?")


def test_an_answer_window_takes_in_the_line_that_heads_it():
    doc = Passage(id="shutil", text="copy2(src, dst)\nCopy data and metadata.\n\nrmtree(path, ignore_errors=False)\n"
                  "Recursively delete a directory tree and everything in it.")
    window = focus_window("How do I delete a directory and everything in it?", [doc])
    assert window is not None and doc.text[window.start:window.end].startswith("rmtree(path")


def test_a_copy_never_repeats_the_text_so_far():
    assert not _ok(ADA[:117], "Augusta"), "a completion prompt's own first sentence is not copied again"
    assert _ok(ADA[:117], " She is chiefly")


GALILEO = Passage(
    id="galileo",
    text="Galileo di Vincenzo Bonaiuti de' Galilei, commonly referred to as Galileo Galilei, was an Italian "
    "astronomer, physicist and engineer. He was born in Pisa, then part of the Duchy of Florence. Galileo has "
    "been called the father of observational astronomy.",
)


def test_the_names_that_pick_the_passage_do_not_pick_the_window():
    """The opening sentence names the subject in full; the sentence that answers rarely does."""
    assert naming_words("In which city was Galileo Galilei born?", [GALILEO]) == {"galileo", "galilei"}
    window = focus_window("In which city was Galileo Galilei born?", [GALILEO])
    assert window is not None and window.answers
    assert GALILEO.text[window.start : window.end].startswith("He was born in Pisa")
    assert focus_window("Who was Galileo Galilei?", [GALILEO]).start == 0, "a question about the name itself opens at the name"


def test_a_window_that_holds_none_of_the_question_opens_the_answer_but_does_not_end_it():
    window = focus_window("What telescope did Galileo Galilei improve?", [GALILEO])
    assert window is not None and not window.answers, "nothing but the name matches: copy on, do not stop"


def test_a_question_for_a_year_is_answered_by_a_window_that_holds_one():
    curie = Passage(id="pc", text="Pierre Curie was a French physicist. With their win, the Curies became the first "
                    "married couple to win a Nobel Prize. Marie Curie won the Nobel Prize in Chemistry in 1911.")
    window = focus_window("In which year did Marie Curie win the Nobel Prize in Chemistry?", [curie])
    assert window is not None and "1911" in curie.text[window.start : window.end]


def test_a_follow_up_is_answered_by_what_it_asks_now():
    parsers = Passage(id="cp", text="Use fastify.addContentTypeParser(contentType, parser) to add a parser for a content "
                      "type.\n\nUse fastify.removeContentTypeParser(contentType) to remove a parser again.")
    query = "How do I add a custom content type parser to Fastify?\nAnd how do I remove it?"
    window = focus_window(query, [parsers])
    assert window is not None and "removeContentTypeParser" in parsers.text[window.start : window.end]


def test_a_follow_up_window_is_ranked_by_what_is_asked_now_as_well_as_by_the_conversation():
    hooks = Passage(id="hooks", text="Use fastify.addHook(name, fn) to add a function to the lifecycle, and check the hooks page.")
    decorators = Passage(id="deco", text="Use fastify.hasDecorator(name) to check for the existence of a decoration.")
    query = "How do I add a utility function to the Fastify instance?\nHow do I check later that it exists?"
    conversation, now = query, query.splitlines()[-1]
    cosines = {(conversation, "hooks"): 0.75, (conversation, "deco"): 0.58, (now, "hooks"): 0.2, (now, "deco"): 0.7}

    def similarity(q: str, texts: list[str]) -> list[float]:
        return [cosines[q, "hooks" if "addHook" in t else "deco"] for t in texts]

    window = focus_window(query, [hooks, decorators], similarity)
    assert window is not None and window.passage_id == "deco"


def test_a_second_window_stays_with_the_person_the_first_is_about():
    curie = Passage(id="curie", text="Marie Curie was a Polish and naturalised-French physicist and chemist. She won the "
                    "Nobel Prize in Physics in 1903 and the Nobel Prize in Chemistry in 1911 for her research.")
    pauling = Passage(id="pauling", text="Linus Pauling was an American chemist. He is one of two people, with Marie "
                      "Curie, to win Nobel Prizes in two fields: the Nobel Prize in Chemistry in 1954 and Peace in 1962.")

    def similarity(query: str, texts: list[str]) -> list[float]:  # the embedder prefers her own sentence
        return [0.9 if "She won" in text else 0.3 for text in texts]

    windows = focus_windows("In which year did Marie Curie win the Nobel Prize in Chemistry?", [curie, pauling], similarity, count=2)
    assert windows and windows[0].passage_id == "curie"
    assert all(window.passage_id == "curie" for window in windows), "Pauling's summary only mentions her"


def test_a_markdown_window_takes_in_its_whole_paragraph():
    """The sentence sharing the question's words leans on the one before it for the answer."""
    doc = Passage(id="s", text=(
        "## Routing\n\nPaths like `/foo` and `/foo/` are different. If you want to change this, set "
        "`ignoreTrailingSlash` to `true`. That way, both `/foo` and `/foo/` will point to the same route.\n\n"
        "Another paragraph about something else entirely.\n"
    ))
    window = focus_window("How do I make /foo and /foo/ point to the same route?", [doc])
    assert window is not None
    text = doc.text[window.start : window.end]
    assert "ignoreTrailingSlash" in text and text.endswith("the same route.") and "Another" not in text
    prose = Passage(id="p", text=doc.text.replace("## Routing\n\n", ""))
    prose_window = focus_window("How do I make /foo and /foo/ point to the same route?", [prose])
    assert "Paths like" not in prose.text[prose_window.start : prose_window.end], "prose keeps its sentence windows"


def test_an_answer_stops_only_where_a_sentence_or_line_ends():
    text = "Parsers handle bodies (e.g. JSON). Use a hook:\n- onSend replaces the payload\nmore"
    assert closes_answer(text, text.index("(e.g.") + 5) is False, "an open bracket: not finished"
    assert closes_answer(text, text.index("JSON).") + 6) is True
    assert closes_answer(text, text.index("hook:") + 5) is False, "a colon announces what follows"
    assert closes_answer(text, text.index("payload") + 7) is True, "a list item ends at its line's end"
    assert closes_answer(text, len(text) - 2) is False, "mid-word"


def test_a_second_window_never_repeats_the_first_from_an_overlapping_chunk():
    """Splitters overlap chunks: the same sentence is a window in two passages, copied once."""
    sentence = "Be aware that if routes are wrapped with fastify-plugin, the prefix option will not work."
    lead = "Register routes with a prefix option. "
    first = Passage(id="a#0", text=f"{lead}{sentence}", doc_id="a", doc_char_start=0)
    second = Passage(id="a#1", text=f"{sentence} Wrap a plugin in a plugin to make the prefix option work.", doc_id="a", doc_char_start=len(lead))
    question = "Does the prefix option work when routes are wrapped with fastify-plugin?"
    windows = focus_windows(question, [first, second], count=2)
    texts = [(first if w.passage_id == "a#0" else second).text[w.start : w.end] for w in windows]
    assert sum(sentence in text for text in texts) == 1, texts
