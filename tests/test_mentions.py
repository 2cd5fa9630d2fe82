"""A question that names something the corpus never mentions is not covered."""

from nest_integrations.policy.mentions import CorpusTerms, question_names
from nest_integrations.policy.words import fold


def test_names_are_capitalised_words_that_do_not_open_a_sentence():
    assert question_names("How do I map a class onto a SQLAlchemy table?") == ["SQLAlchemy"]
    assert question_names("I'm renaming --old to --new. How can I flag --old as obsolete?") == []
    assert question_names("Would XL in capitals be accepted for xl then?") == ["XL"]
    assert question_names("Does it support PowerShell, and PowerShell 7?") == ["PowerShell"]
    assert question_names("which flag turns off colour?") == []
    assert question_names("Who is Frida Kahlo, and what is a JSON Web Token?") == ["Frida Kahlo", "JSON Web Token"]
    assert question_names("Is an SSH URL accepted by the LFS API?") == ["SSH", "URL", "LFS", "API"], "a run of acronyms is its words"


def test_a_word_rare_in_english_is_a_name_in_any_case_and_a_common_one_is_not():
    assert question_names("How do I send restic's log messages to syslog?") == ["restic", "syslog"]
    assert question_names("Pydantic models: can marshmallow read them?") == ["Pydantic"]
    assert question_names("How do I enable tab completion for the fish shell?") == []
    # Words with digits and short parts of identifiers are read as spelled elsewhere, not as names.
    assert question_names("Does it speak http2 when kw_only is set?") == []


def test_a_name_is_mentioned_when_every_word_of_it_is_in_the_corpus_whatever_its_case_and_accents():
    terms = CorpusTerms(["Mohandas Gandhi, called Mahātmā, led the campaign.", "Sizes: xl, l and json web tokens."])
    assert fold("Mahātmā") == "mahatma"
    assert terms.unmentioned("Who first called Mahatma Gandhi by that name?") == []
    assert terms.unmentioned("Is XL accepted, and is a JSON Web Token?") == []
    assert terms.unmentioned("How do I install it on PowerShell or with Django?") == ["PowerShell", "Django"]
    assert terms.unmentioned("Who painted like Frida Kahlo?") == ["Frida Kahlo"]
    assert not terms.mentions("") and terms.mentions("json-web") and len(terms) > 10


def test_a_word_is_mentioned_by_a_word_of_its_stem_or_one_it_begins():
    terms = CorpusTerms(["Install the macOS build; recursion stops at the depth limit."])
    assert terms.unmentioned("On my Mac, does recursing stop?") == []
    assert terms.unmentioned("Can it log to syslog on my Mac?") == ["syslog"]
