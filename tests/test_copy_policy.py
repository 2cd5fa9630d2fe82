"""Seams (where a copy may start), where an answer may stop, and the conversation's retrieval query."""

from nest_integrations.policy.conversation import is_follow_up, retrieval_query
from nest_integrations.policy.copy_policy import (
    acceptable_start, closes_answer, is_question, sentence_starts, stops_whole, wants_focus,
)

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


def test_questions_are_told_from_requests():
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


def test_a_copy_never_repeats_the_text_so_far():
    assert not _ok(ADA[:117], "Augusta"), "a completion prompt's own first sentence is not copied again"
    assert _ok(ADA[:117], " She is chiefly")


def test_an_answer_stops_only_where_a_sentence_or_line_ends():
    text = "Parsers handle bodies (e.g. JSON). Use a hook:\n- onSend replaces the payload\nmore"
    assert closes_answer(text, text.index("(e.g.") + 5) is False, "an open bracket: not finished"
    assert closes_answer(text, text.index("JSON).") + 6) is True
    assert closes_answer(text, text.index("hook:") + 5) is False, "a colon announces what follows"
    assert closes_answer(text, text.index("payload") + 7) is True, "a list item ends at its line's end"
    assert closes_answer(text, len(text) - 2) is False, "mid-word"


def test_an_answer_does_not_stop_where_a_line_announces_what_follows():
    text = (
        "On Debian, install the package from the official repos, e.g.\n\n.. code-block:: console\n\n"
        "    $ apt-get install restic\n\nTo get the development version, run\n\n.. code-block:: shell-session\n\n"
        "    $ pip install -U git+https://example.org/repo.git@dev\n"
    )
    assert closes_answer(text, text.index("e.g.") + 4) is False, "'e.g.' ends no sentence: the example follows"
    assert closes_answer(text, text.index("console") + 7) is False, "a code directive: its code follows"
    assert closes_answer(text, text.index("restic") + 6) is True, "the announced code line ends it"
    assert closes_answer(text, text.index("run") + 3) is False, "the code directive on the next line announces its code"
    assert closes_answer(text, text.index("dev\n") + 3) is True, "the announced code line ends it"
    literal = "If you'd like to change the IO priority, run it in the following way\n\n::\n\n    $ ionice -c2 restic backup\n"
    assert closes_answer(literal, literal.index("way") + 3) is False, "a lone ``::`` on the next line announces a literal block"
    assert closes_answer(text, text.index("shell-session") + 13) is False




def test_stops_whole_where_a_sentence_ends_and_nothing_is_announced_or_hidden():
    """Where a budget may end a copied answer: after a whole sentence, not mid-way, not after a
    line that announces an example, not on a heading's title, not at a chunk's cut mid-sentence."""
    text = (
        "# Combining\n\nUse the **combine** command to merge them::\n\n    $ coverage combine\n\n"
        "Coverage.py collects the data. The current directory isn't searched.\n\nIf you name"
    )
    at = lambda piece: text.index(piece) + len(piece)  # noqa: E731
    assert stops_whole(text, at("the data.")) and stops_whole(text, at("searched."))
    assert stops_whole(text, at("searched.\n\n"))  # the white space after a sentence
    assert not stops_whole(text, at("collects the"))
    assert not stops_whole(text, at("merge them::"))  # announces the example below it
    assert not stops_whole(text, at("# Combining"))  # a title, with nothing under it
    assert not stops_whole(text, len(text))  # the chunk is cut mid-sentence
    assert stops_whole("It ends here.", len("It ends here."))
