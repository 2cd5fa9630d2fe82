"""The retrieval query of a conversation: what the first stage searches for.

A chat's last user message is often a follow-up that names nothing ("And how
do I send a value into it?"): searched alone it retrieves nothing relevant and
the LM invents. The rule here, used by the decoder and both integrations:

* the query is the last user message;
* when that message is a *follow-up* -- it has at most
  ``FOLLOW_UP_MAX_WORDS`` content words, or refers back with a pronoun or an
  opening connective ("it", "they", "that", "and ...", "what about ...") --
  the previous user messages are prepended, newest last, until
  ``HISTORY_MAX_WORDS`` words of history are included.

Assistant turns are left out: they are the LM's own words (possibly invented)
and would pull retrieval towards what was already said rather than what is
asked. System turns are instructions, not topics.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from nest_integrations.corpus.chunking import sentence_spans

from .words import folded_words

FOLLOW_UP_MAX_WORDS = 3
"""A last message with this many content words or fewer is read as a follow-up."""

HISTORY_MAX_WORDS = 64
"""At most this many words of earlier user turns are prepended to a follow-up."""

_BACK_REFERENCES = frozenset(
    "it its it's itself they them their theirs this that these those he him his she her hers one ones "
    "there then such same former latter".split()
)
_OPENING_CONNECTIVES = ("and", "also", "but", "so", "then", "what about", "how about", "and what", "and how", "why")
_FUNCTION_WORDS = frozenset(
    "a an the of to in on for with by at from as is are was were be been do does did can could would should "
    "will shall may might must i you we me my your our what which who whom whose how why when where please "
    "tell show give explain about or and not no yes".split()
)




def is_follow_up(message: str) -> bool:
    """Whether a user message leans on earlier turns (see the module docstring)."""
    words = folded_words(message, joined=True)
    if not words:
        return True
    content = [w for w in words if w not in _FUNCTION_WORDS and w not in _BACK_REFERENCES]
    if len(content) <= FOLLOW_UP_MAX_WORDS:
        return True
    opening = " ".join(words[:2])
    if any(opening == c or opening.startswith(c + " ") or words[0] == c for c in _OPENING_CONNECTIVES):
        return True
    return any(w in _BACK_REFERENCES for w in words)


def retrieval_query(messages: Sequence[Mapping[str, str]]) -> str:
    """The first-stage query for a list of ``{"role", "content"}`` messages.

    Returns "" when there is no user message. Examples::

        >>> retrieval_query([{"role": "user", "content": "What is a generator in Python?"},
        ...                  {"role": "assistant", "content": "A function that yields."},
        ...                  {"role": "user", "content": "And how do I send a value into it?"}])
        'What is a generator in Python?\\nAnd how do I send a value into it?'
    """
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    users = [u for u in users if u.strip()]
    if not users:
        return ""
    last = users[-1]
    if len(users) == 1 or not is_follow_up(last):
        return last
    history: list[str] = []
    budget = HISTORY_MAX_WORDS
    for earlier in reversed(users[:-1]):
        budget -= len(folded_words(earlier, joined=True))
        if budget < 0 and history:
            break
        history.insert(0, earlier)
        if not is_follow_up(earlier):
            break  # a self-contained question: the topic starts here
    return "\n".join([*history, last])


PLAIN_ROLES = {"system": "", "user": "User", "assistant": "Assistant"}
"""Speaker labels of :func:`plain_transcript`; the system turn goes first, unlabelled."""

TRANSCRIPT_STOP = "\nUser:"
"""Where an answer to a plain transcript ends: a base model goes on to write the user's next turn."""


def question_asked_now(query: str) -> str:
    """The last line of a retrieval query (:func:`retrieval_query`): the question asked now, a
    follow-up's query holding the earlier questions above it; ``""`` for a blank query."""
    lines = query.strip().splitlines()
    return lines[-1] if lines else ""


def asked_sentences(query: str) -> str:
    """The sentences of the question asked now (:func:`question_asked_now`) that ask, those
    ending in "?", one space apart; the whole question when none does ("Tell me how to ...").

    The statements around them set the scene in the user's own words ("Our tests run in
    Docker.", "My MacBook falls asleep in the middle of a backup.") and name what the user
    has, not what is asked: the checks for names the documents never mention read these
    sentences alone, as they read the question asked now and not the earlier ones. A piece
    that opens in lower case goes on from the one before it (the sentence end read in
    "app.set('trust proxy', ...) accept?")."""
    question = question_asked_now(query)
    pieces: list[list[int]] = []
    for start, end in sentence_spans(question):
        if pieces and question[start:end][:1].islower():
            pieces[-1][1] = end
        else:
            pieces.append([start, end])
    asking = [question[start:end] for start, end in pieces if question[start:end].endswith("?")]
    return " ".join(asking) if asking else question


def plain_transcript(messages: Sequence[Mapping[str, str]], system_prompt: str | None = None) -> str:
    """A conversation as plain text, for a model without a chat template (a base model).

    Each turn is ``"User: ..."`` / ``"Assistant: ..."`` on its own line, the
    system prompt (or a system message) first, and the text ends with an open
    ``"Assistant:"`` line and a line break, so the model's continuation is the
    answer: no template token marks where it starts, and nothing in decoding
    looks for one. The line break matters: after ``"Assistant:"`` a base model
    expects a word with a leading space, which a copy of a passage's first word
    does not have; after the break it expects the word as a passage begins
    (Gemma-3-270M, 6 biography requests: the summary's first token has 0.0002
    to 0.002 of the most likely token's probability after the colon, 0.06 to 1
    after the break).

        >>> plain_transcript([{"role": "user", "content": "Tell me a bio of Ada Lovelace."}])
        'User: Tell me a bio of Ada Lovelace.\\nAssistant:\\n'
    """
    lines: list[str] = []
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        lines.append(system_prompt.strip())
    for message in messages:
        role = str(message.get("role") or "user")
        content = str(message.get("content") or "").strip()
        label = PLAIN_ROLES.get(role, role.capitalize())
        lines.append(f"{label}: {content}" if label else content)
    lines.append("Assistant:")
    return "\n".join(line for line in lines if line) + "\n"
