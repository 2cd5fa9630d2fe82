"""The relevance gate's entity check and thresholds."""

from nest_integrations.corpus import Passage
from nest_integrations.relevance import content_words, gate, names_subject


def test_content_words_fold_accents_and_drop_parentheticals():
    assert content_words("Constantin Brâncuși (sculptor)") == {"constantin", "brancusi"}
    assert content_words("Joan of Arc") == {"joan", "arc"}


def test_query_must_name_the_passage_subject():
    marie, pierre = Passage(id="m", title="Marie Curie", text="..."), Passage(id="p", title="Pierre Curie", text="...")
    assert names_subject("Tell me a bio of Marie Curie.", marie)
    assert not names_subject("Tell me a bio of Marie Curie.", pierre)
    assert names_subject("anything", Passage(id="u", text="untitled passages count as named"))


def test_gate_combines_similarity_and_naming():
    marie, pierre = Passage(id="m", title="Marie Curie", text="..."), Passage(id="p", title="Pierre Curie", text="...")
    query = "Marie Curie"
    assert gate(query, [marie, pierre], [0.55, 0.68], 0.45, 0.75) == [marie], "another person's passage stays out"
    assert gate(query, [marie, pierre], [0.40, 0.80], 0.45, 0.75) == [pierre], "very close passages pass unnamed"
    assert gate(query, [marie], [0.30], 0.45, 0.75) == []
