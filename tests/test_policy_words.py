"""The one word tokenizer of the policy rules."""

from nest_integrations.policy.conversation import is_follow_up
from nest_integrations.policy.words import folded_words, split_words


def test_code_names_split_into_words_and_joined_words_keep_apostrophes_and_hyphens():
    assert split_words("Call reply.redirect(url) on JSONDecodeError") == ["Call", "reply", "redirect", "url", "on", "JSONDecodeError"]
    assert folded_words("It's the set-cookie header", joined=True) == ["it's", "the", "set-cookie", "header"]
    assert folded_words("It's the set-cookie header") == ["it", "s", "the", "set", "cookie", "header"]


def test_a_follow_up_counts_a_hyphenated_word_once():
    # Three content words when "set-cookie" is one word: a follow-up; four if it were split.
    assert is_follow_up("Reset set-cookie too?")
