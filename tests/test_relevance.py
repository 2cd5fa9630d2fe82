"""The relevance gate: similarity, query coverage and the subject check, without titles."""

import pytest

from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.conversation import asked_sentences, retrieval_query
from nest_integrations.policy.relevance import (
    RelevanceGate,
    content_words,
    coverage,
    named_words,
    names_subject,
    naming_passages,
    passage_similarities,
    query_names,
    reading_sections,
    scoped_identifiers,
    subject_name,
    unmentioned_identifiers,
    unmentioned_names,
)

MARIE = Passage(id="m", text="Maria Salomea Skłodowska-Curie, known simply as Marie Curie, was a Polish physicist.")
PIERRE = Passage(id="p", text="Pierre Curie was a French physicist. He shared the Nobel Prize with his wife, Marie Curie.")


def test_content_words_fold_accents_stem_and_drop_parentheticals():
    assert content_words("Constantin Brâncuși (sculptor)") == {"constantin", "brancusi"}
    assert content_words("How do I use slicings?") == content_words("slicing") == content_words("slice")
    assert content_words("recursing") == content_words("recursion") and content_words("adding") == content_words("add")


def test_subject_names_come_from_bare_names_and_requests():
    assert subject_name("Marie Curie") == "Marie Curie"
    assert subject_name("Tell me a bio of Ada Lovelace.") == "Ada Lovelace"
    assert subject_name("Who was Pedro I of Brazil?") == "Pedro I of Brazil"
    assert subject_name("How do I send a value into a generator?") is None


def test_a_passage_must_open_with_the_subject():
    assert names_subject("Marie Curie", MARIE.text)
    assert not names_subject("Marie Curie", PIERRE.text), "named later, not the subject"
    assert not names_subject("Alexander Pope", "Pope Alexander VI was head of the Catholic Church.")
    assert not names_subject("Pedro I of Brazil", "Pedro II was the second and last monarch of Brazil.")
    assert names_subject("Pedro I of Brazil", "Pedro I was the founder of the Empire of Brazil.")
    assert names_subject("Arthur C. Clarke", "Sir Arthur Charles Clarke was an English writer.")
    assert names_subject("Theodor W. Adorno", "Theodor W. Adorno was a German philosopher.")


def test_titles_play_no_part():
    titled = Passage(id="t", title="apt-get.8", text="apt-get installs packages: apt-get install installs a package.")
    gate = RelevanceGate()
    assert gate("How do I install a package with apt-get?", [titled], [0.6]).kept == [titled]
    assert gate("Marie Curie", [Passage(id="x", title="Marie Curie", text=PIERRE.text)], [0.7]).kept == []


def test_gate_combines_similarity_margin_and_coverage():
    gate = RelevanceGate(min_similarity=0.3, similarity_margin=0.2, min_coverage=0.5)
    assert gate("Marie Curie", [MARIE, PIERRE], [0.55, 0.68]).kept == [MARIE]
    assert gate("Marie Curie", [MARIE], [0.2]).reason == "nothing_relevant"
    seq = Passage(id="s", text="Sequences support slicing; reversed() returns a reverse iterator over a sequence.")
    assert coverage("reverse a string in JavaScript", seq.text) < 0.5
    assert gate("reverse a string in JavaScript", [seq], [0.32]).kept == [], "measured: off-corpus questions <= 0.36"
    assert gate("How do I reverse a list in place?", [seq], [0.5]).kept == [seq], "a close paraphrase needs no coverage"
    far = Passage(id="f", text="A sequence is an ordered collection, and slicing a sequence returns a new one.")
    assert gate("How does slicing a sequence work?", [seq, far], [0.7, 0.45]).kept == [seq], "outside the margin"
    with pytest.raises(ValueError):
        RelevanceGate(min_coverage=2.0)
    with pytest.raises(ValueError):
        gate("q", [seq], [])


HAYTHAM = "Ibn al-Haytham, Latinized as Alhazen, was a mathematician, astronomer, and physicist of the Islamic Golden Age."
WAHHAB = "Shaykh al-Islam al-Imam Muhammad ibn Abd al-Wahhab ibn Sulayman al-Tamimi al-Najdi was an Arab Muslim scholar."
LUMIERE = "The Lumière brothers, Auguste Marie Louis Nicolas Lumière and Louis Jean Lumière, were French manufacturers."
MARX = "The Marx Brothers were an American comedy troupe who achieved success in vaudeville, on Broadway, and in film."
GRAHAM = "William Franklin Graham Jr. was an American evangelist, ordained Southern Baptist minister, and civil rights advocate."


def test_generic_name_words_name_nobody():
    """Particles and group nouns ("ibn", "al", "brothers", "the") are shared by many names: a passage
    that shares only them with the query is not about its subject."""
    assert subject_name("Tell me a bio of Ibn al-Haytham.") == "Ibn al-Haytham"
    assert names_subject("Ibn al-Haytham", HAYTHAM) and not names_subject("Ibn al-Haytham", WAHHAB)
    assert subject_name("Tell me a bio of the Lumière brothers.") == "Lumière brothers"
    assert names_subject("Lumière brothers", LUMIERE) and not names_subject("Lumière brothers", MARX)
    assert content_words("Tell me a bio of Ibn al-Haytham") == {"bio", "haytham"}
    gate = RelevanceGate()
    assert gate("Tell me a bio of Ibn al-Haytham.", [Passage(id="w", text=WAHHAB)], [0.5]).kept == []
    assert gate("Tell me a bio of the Lumière brothers.", [Passage(id="m", text=MARX)], [0.6]).kept == []


def test_a_familiar_given_name_finds_the_formal_one():
    assert names_subject("Billy Graham", GRAHAM), "Billy is William"
    assert names_subject("Tom Hanks", "Thomas Jeffrey Hanks is an American actor and filmmaker.")
    assert not names_subject("Billy Graham", "Franklin Graham is an American evangelist and missionary."), "the given name still counts"
    assert not names_subject("Graham Greene", GRAHAM), "only a given name has other forms"


def test_initials_and_joined_particles_must_match_too():
    assert names_subject("G. H. Hardy", "Godfrey Harold Hardy was an English mathematician.")
    assert not names_subject("G. H. Hardy", "Thomas Hardy was an English novelist and poet.")
    assert not names_subject("T. S. Eliot", "Mary Ann Evans, known by her pen name George Eliot, was an English novelist.")
    assert subject_name("Ahmad ibn Ibrahim al-Ghazi") == "Ahmad ibn Ibrahim al-Ghazi"
    assert subject_name("Al-Hakim bi-Amr Allah") == "Al-Hakim bi-Amr Allah"
    assert not names_subject("Ahmad ibn Ibrahim al-Ghazi", "Ahmad ibn Hanbal was a Muslim jurist, theologian and ascetic.")


def test_a_question_naming_someone_needs_a_passage_that_mentions_them():
    ngugi = Passage(id="n", text="Ngũgĩ wa Thiong'o was a Kenyan author and academic, described as East Africa's leading novelist.")
    gate = RelevanceGate()
    assert gate("What novel did Chimamanda Ngozi Adichie write?", [ngugi], [0.5]).kept == []
    assert gate("Which novel did Ngũgĩ wa Thiong'o write first?", [ngugi], [0.5]).kept == [ngugi]
    graham = Passage(id="g", text=GRAHAM)
    assert gate("Where did Billy Graham preach?", [graham], [0.5]).kept == [graham], "in any given-name form"
    assert query_names("What was the name of Johnny Cash's backing band?") == ["Johnny Cash"], "a possessive is the name"


def test_a_name_never_runs_across_a_sentence_end():
    """"... several times in Fastify. How do I reset it?" names nothing: "Fastify. How" is no name."""
    header = Passage(id="h", text="In Fastify, reply.removeHeader(key) removes a previously set header, such as set-cookie.")
    query = "I called reply.header('set-cookie', ...) several times in Fastify. How do I reset the set-cookie header?"
    assert query_names(query) == []
    assert RelevanceGate()(query, [header], [0.7]).kept == [header]
    assert query_names("When was J. R. R. Tolkien born? Where did J. R. R. Tolkien teach?") == ["J. R. R. Tolkien", "J. R. R. Tolkien"]


def test_a_run_of_acronyms_is_not_one_name_each_word_is_named():
    """"an SSH URL" is a thing and its kind: the section on SSH remotes never writes the two
    words together, and a question that asks about one still gets it; a word it names that no
    passage holds still keeps nothing."""
    ssh = Passage(id="s", text="If the remote is reached over SSH, the client runs git-lfs-authenticate on the server to get an href for the LFS API.")
    query = "When the remote is an SSH URL, which command does the client run over SSH to reach the LFS API?"
    urls = Passage(id="u", text="The LFS API's URL is found from the Git remote's URL.")
    assert query_names(query) == []
    assert ssh in RelevanceGate()(query, [ssh, urls], [0.6, 0.5]).kept
    assert RelevanceGate()("Which command runs over SSH for the LFS API with an SSH URL on Gitea?", [ssh, urls], [0.6, 0.5]).kept == []
    assert query_names("What is a JSON Web Token in the HTTP API?") == ["JSON Web Token"], "a run with a word that is not an acronym stays a name"


def test_a_question_about_something_no_retrieved_passage_names_keeps_nothing():
    """Another framework's feature over Fastify's docs, a person the summaries do not hold."""
    routes = Passage(id="r", text="Register routes under a prefix: fastify.register(plugin, { prefix: '/v1' }).")
    gate = RelevanceGate()
    assert gate("How do I register a Flask blueprint under a URL prefix?", [routes], [0.6]).kept == []
    assert gate("How do I register routes under a prefix in Fastify?", [routes], [0.6]).kept == [routes]
    assert named_words("Apart from plugins, how does Fastify's reply.removeHeader work?") == ["Fastify"], "not a line's first word"
    gates = Passage(id="g", text="William Henry Gates III is an American businessman who co-founded Microsoft.")
    assert unmentioned_names("With whom did Bill Gates co-found Microsoft?", [gates]) == []
    assert unmentioned_names("Which valley did Malala Yousafzai grow up in?", [gates, routes]) == ["Malala", "Yousafzai"]


def test_a_follow_ups_names_are_those_of_the_question_asked_now():
    """An earlier question's names are the user's setting ("in Python"): the follow-up is answered
    from passages that never name it, as the corpus-wide names check reads it; a name in the
    question asked now still keeps nothing."""
    stage3 = Passage(id="t", text='After all transfers, git-lfs sends {"event": "terminate"} and the process cleans up and exits.')
    gate = RelevanceGate()
    earlier = [{"role": "user", "content": "I'm writing a custom transfer agent in Python. How does it talk to git-lfs?"},
               {"role": "assistant", "content": "Over stdin and stdout, one JSON message a line."}]
    follow_up = retrieval_query([*earlier, {"role": "user", "content": "How does git-lfs tell my process it's done so it can clean up and exit?"}])
    assert "Python" in follow_up and gate(follow_up, [stage3], [0.6]).kept == [stage3]
    in_python = retrieval_query([*earlier, {"role": "user", "content": "How does it tell my Python process to clean up and exit?"}])
    assert gate(in_python, [stage3], [0.6]).kept == []


def test_names_in_a_statement_of_the_users_setting_are_not_what_is_asked():
    """ "Our tests run in Docker." sets the scene: the question after it is answered from passages
    that never name Docker; a name in the sentence that asks still keeps nothing."""
    relative = Passage(id="r", text="relative_files (boolean): store relative file paths in the data file, so it can be combined elsewhere.")
    gate = RelevanceGate()
    in_docker = "Our tests run in Docker and the data is combined on the host. How do I record relative paths?"
    assert asked_sentences(in_docker) == "How do I record relative paths?"
    assert gate(in_docker, [relative], [0.6]).kept == [relative]
    assert gate("How do I record relative paths for Docker?", [relative], [0.6]).kept == []
    assert asked_sentences("What values does app.set('trust proxy', ...) accept?") == "What values does app.set('trust proxy', ...) accept?", (
        "a piece that opens in lower case goes on from the one before"
    )
    assert asked_sentences("Tell me how to record relative paths in Docker.") == "Tell me how to record relative paths in Docker."
    assert asked_sentences("earlier question\nI use Docker. Why? How?") == "Why? How?"


def test_a_package_or_member_no_retrieved_passage_names_keeps_nothing():
    """Every word of "@fastify/rate-limit" is in the body-limit paragraph, but the package is not."""
    body = Passage(id="b", text="Fastify will check the maximum size (bodyLimit) of the body: requests over the limit are rejected at a fixed rate.")
    gate = RelevanceGate()
    assert gate("How do I limit each client to 100 requests per minute with @fastify/rate-limit?", [body], [0.6]).kept == []
    assert scoped_identifiers("With @fastify/rate-limit and reply.redirect?") == ["rate-limit", "redirect"]
    assert scoped_identifiers("Can winston-daily-rotate-file keep 14 days, end-to-end?") == ["winston-daily-rotate-file"]
    flags = Passage(id="f", text="Boolean flags can be given in pairs: --shout/--no-shout turns shouting on or disables it.")
    assert scoped_identifiers("How do I define an on/off flag pair such as --shout?") == [], "English alternatives name no package"
    assert gate("How do I define an on/off flag pair such as --shout?", [flags], [0.6]).kept == [flags]
    assert scoped_identifiers("How do I make the pino/file transport truncate?") == ["file"], "a module path is still one"
    logrotate = Passage(id="l", text="We would rotate our log files with logrotate: daily, rotate 7, compress.")
    assert RelevanceGate()("How do I configure winston-daily-rotate-file to keep 14 days of log files?", [logrotate], [0.6]).kept == []
    assert unmentioned_identifiers("What does json.dumps return?", [Passage(id="j", text="dumps(obj) serializes obj.")]) == [], (
        "the last part is enough: docstrings name a function without its module"
    )
    assert gate("What is the body limit of Fastify?", [body], [0.6]).kept == [body]


LONG_CHUNK = (
    "# Server\n\nThe server factory takes options.\n\n"
    + "".join(f"## Option {i}\n\n" + " ".join(["Filler words about unrelated settings."] * 30) + "\n\n" for i in range(3))
    + "## keepAliveTimeout\n\nThe socket is kept open for 72 seconds after the last response.\n"
)


def test_a_long_markdown_chunk_is_read_section_by_section():
    sections = reading_sections(LONG_CHUNK)
    assert len(sections) > 1
    last = LONG_CHUNK[sections[-1][0] : sections[-1][1]]
    assert "## keepAliveTimeout" in last and "# Server" not in last and "Option 0" not in last
    assert reading_sections("Plain prose. " * 200) == [(0, len("Plain prose. " * 200))], "prose is read whole"
    short = "## Title\n\nOne short section.\n"
    assert reading_sections(short) == [(0, len(short))]


calls: list = []


def _keyword_relevance(query, texts):
    """Cosine stand-in: 0.9 for a section that says how long a socket is kept open, 0.1 for anything
    else (the whole chunk, which an embedder reads only the start of); records each call's texts."""
    calls.append(list(texts))
    return [0.9 if "kept open" in t and not t.startswith("# Server") else 0.1 for t in texts]


def test_a_long_chunk_is_as_relevant_as_its_section_that_answers():
    calls.clear()
    long_chunk = Passage(id="long", text=LONG_CHUNK)
    other = Passage(id="other", text="Hooks run in order.")
    similarities = passage_similarities("How long is an idle socket kept open?", [long_chunk, other], _keyword_relevance)
    assert similarities == [0.9, 0.1], "the whole chunk reads 0.1; its last section 0.9"
    assert len(calls) == 1, "every text is asked for in one call"
    decision = RelevanceGate(min_similarity=0.3, similarity_margin=0.2, min_coverage=0.0).decide(
        "How long is an idle socket kept open?", [long_chunk, other], _keyword_relevance
    )
    assert [p.id for p in decision.kept] == ["long"]


def test_the_passages_that_name_what_a_question_asks_about():
    """Every name the question gives where one passage mentions them all; each person's own
    passage for a question about two; every passage for a question that names nobody."""

    curie = Passage("curie", "Marie Curie was a Polish and naturalised-French physicist and chemist.")
    turing = Passage("turing", "Alan Turing was an English mathematician and computer scientist.")
    silent = Passage("silent", "William the Silent is named in the Dutch national anthem.")
    blake = Passage("blake", "William Blake was an English poet, painter and printmaker.")

    def ids(query: str, passages: list[Passage]) -> list[str]:
        return [p.id for p in naming_passages(query, passages)]

    assert ids("What nationality was William Blake?", [silent, blake]) == ["blake"]
    assert ids("Who were Marie Curie and Alan Turing?", [turing, silent, curie]) == ["turing", "curie"]
    assert ids("What is the Dutch national anthem about?", [silent, blake]) == ["silent", "blake"]
