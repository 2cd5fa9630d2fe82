"""The one word tokenizer and the one stemmer of the policy rules."""

from concurrent.futures import ThreadPoolExecutor

from nest_integrations.policy.conversation import is_follow_up
from nest_integrations.policy.words import folded_words, split_words, stem


def test_code_names_split_into_words_and_joined_words_keep_apostrophes_and_hyphens():
    assert split_words("Call reply.redirect(url) on JSONDecodeError") == ["Call", "reply", "redirect", "url", "on", "JSONDecodeError"]
    assert folded_words("It's the set-cookie header", joined=True) == ["it's", "the", "set-cookie", "header"]
    assert folded_words("It's the set-cookie header") == ["it", "s", "the", "set", "cookie", "header"]


def test_a_follow_up_counts_a_hyphenated_word_once():
    # Three content words when "set-cookie" is one word: a follow-up; four if it were split.
    assert is_follow_up("Reset set-cookie too?")


def test_a_word_and_its_forms_share_a_stem_when_many_threads_ask_at_once():
    # A server answers questions in threads; each reads words through the one stemmer.
    forms = [("recursing", "recursion"), ("slicings", "slice"), ("validators", "validation"), ("decoded", "decode"), ("adding", "add")]
    words = [word for pair in forms for word in pair] * 200
    stem.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        stems = dict(zip(words, pool.map(stem, words)))
    assert all(stems[a] == stems[b] for a, b in forms)
