"""Seams (where a copy may start), where an answer may stop, how far its best window goes, and the conversation's retrieval query."""

from nest_integrations.policy.conversation import is_follow_up, retrieval_query
import pytest

from nest_integrations.corpus.markdown_structure import section_end
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.copy_policy import (
    Window,
    acceptable_start,
    closes_answer,
    is_question,
    sentence_starts,
    to_section_end,
    wants_focus,
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
    assert closes_answer(text, text.index("run") + 3) is True, "a line end with nothing announced"
    assert closes_answer(text, text.index("shell-session") + 13) is False




TIMEOUTS_MD = "## Timeouts\n\nSet `timeout` on the client.\n\nThe default is 30 seconds.\n\n## Retries\n\nRetries are off."
TIMEOUTS_RST = (
    "Timeouts\n========\n\nSet ``timeout`` on the client.\n\nThe default is 30 seconds.\n\n"
    ".. _retries:\n\nRetries\n=======\n\nRetries are off."
)


@pytest.mark.parametrize("text", [TIMEOUTS_MD, TIMEOUTS_RST])
def test_a_section_ends_before_the_next_heading_and_its_label(text):
    end = section_end(text, text.index("client.") + len("client."))
    assert text[:end].endswith("The default is 30 seconds."), "white space and a label before the heading are not the section's"
    assert section_end(text, text.index("off")) == len(text), "the last section ends with the text"
    assert section_end("Set timeout on the client. The default is 30 seconds.", 10) == 10, "prose has no sections"


def test_the_best_window_goes_on_to_its_section_end():
    """The sentence that names the option wins; the default it asks for follows in its section."""
    passage = Passage(id="client", text=TIMEOUTS_MD)
    text = passage.text
    best = Window("client", text.index("Set"), text.index("client.") + len("client."), 0.9)
    inside = Window("client", text.index("The default"), text.index("seconds.") + len("seconds."), 0.5)
    elsewhere = Window("client", text.index("Retries are"), len(text), 0.4)
    widened = to_section_end([best, inside, elsewhere], [passage])
    assert [text[w.start : w.end] for w in widened] == [
        "Set `timeout` on the client.\n\nThe default is 30 seconds.", "Retries are off."
    ], "the window it now holds is left out, the next section's stays"
    assert widened[0].score == best.score
    prose = Passage(id="prose", text="Set timeout on the client. The default is 30 seconds.")
    sentence = Window("prose", 0, len("Set timeout on the client."), 0.9)
    assert to_section_end([sentence], [prose]) == [sentence], "prose keeps its windows"
    assert to_section_end([], [passage]) == []
    announcing = Passage(id="retry", text="## Retries\n\nSet a policy as follows:\n\n    client.retry(3)\n\n## Next\n\nMore.")
    colon = Window("retry", announcing.text.index("Set"), announcing.text.index("follows:") + len("follows:"), 0.9)
    assert to_section_end([colon], [announcing]) == [colon], "its copy runs on anyway, past its passage's end too"
