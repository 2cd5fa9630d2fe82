"""Prompts: their checks, the text the LM reads and its token ids.

* :func:`check_prompt` / :func:`check_prompts`: a prompt is a string or a list of
  ``{"role", "content"}`` messages, refused with an error naming what is wrong before any work;
* :func:`format_prompt`: the chat template (or a plain transcript for a model without one)
  around the messages, with the passages of the rag modes before the request;
* :func:`encode_prompt`: the token ids, cut so the generation fits the context;
* :func:`default_query`, :func:`is_chat`, :func:`with_transcript_stop`: what a prompt asks, and
  whether it is a conversation or text to continue.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Sequence, Union

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.conversation import TRANSCRIPT_STOP, plain_transcript, retrieval_query
from .output import GenerationStats

logger = logging.getLogger(__name__)

__all__ = [
    "MIN_PROMPT_TOKENS", "Message", "PromptLike", "check_prompt", "check_prompts", "check_text", "default_query",
    "encode_prompt", "eos_token_ids", "format_prompt", "is_chat", "with_transcript_stop",
]

Message = Mapping[str, str]
PromptLike = Union[str, Sequence[Message]]

MIN_PROMPT_TOKENS = 16
"""A prompt is cut to fit the context (its last tokens are kept), but never to fewer than
this many tokens (or its whole length when shorter): a ``max_new_tokens`` that leaves
less room is an error, not a generation that has lost its prompt."""


def check_text(text: str, what: str) -> None:
    """Refuse text the tokenizer cannot encode: a lone surrogate is not Unicode text (``what`` names it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{what} holds a lone surrogate ({text[err.start]!r} at character {err.start}), which is not valid "
            "Unicode; decode the source with errors='replace' or remove it"
        ) from None


def check_prompt(prompt: Any) -> None:
    """Check a prompt: a string, or a non-empty list of ``{"role": str, "content": str}`` messages.

    Raises:
        TypeError: the prompt is neither a string nor a list (e.g. a single message dict or bytes).
        ValueError: no messages; a message that is not a mapping, lacks a non-empty string ``role``
            or a string ``content`` (named by its index); or text with a lone surrogate.
    """
    if isinstance(prompt, str):
        check_text(prompt, "the prompt")
        return
    if isinstance(prompt, (bytes, bytearray, Mapping)) or not isinstance(prompt, Sequence):
        raise TypeError(
            f"the prompt must be a string or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}"
        )
    if not prompt:
        raise ValueError("the prompt has no messages")
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} must be a {{'role', 'content'}} dict, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {i} needs a non-empty string 'role', got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"message {i} needs a string 'content', got {type(content).__name__}")
        check_text(role, f"message {i} role")
        check_text(content, f"message {i} content")


def check_prompts(prompts: Any, queries: Optional[Sequence[Optional[str]]]) -> tuple[list[PromptLike], list[Optional[str]]]:
    """The prompts of a batch call and their retrieval queries (None each when ``queries`` is None), every one checked.

    Raises:
        TypeError: ``prompts`` is a string (or not a list), or a prompt has the wrong type.
        ValueError: a malformed prompt (named by its index), or ``queries`` of another length.
    """
    if isinstance(prompts, (str, bytes, Mapping)) or not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts must be a list of prompts (strings or message lists), got {type(prompts).__name__}; "
            "use generate() for a single prompt"
        )
    prompts = list(prompts)
    for i, prompt in enumerate(prompts):
        try:
            check_prompt(prompt)
        except (TypeError, ValueError) as err:
            raise type(err)(f"prompts[{i}]: {err}") from None
    if queries is not None and (isinstance(queries, (str, bytes)) or len(queries) != len(prompts)):
        got = "a string" if isinstance(queries, (str, bytes)) else f"{len(queries)} queries"
        raise ValueError(f"got {len(prompts)} prompts but {got}")
    return prompts, list(queries) if queries is not None else [None] * len(prompts)


def is_chat(prompt: PromptLike, config: NestConfig) -> bool:
    """Whether the prompt is a conversation (messages, or a string with ``use_chat_template``) rather
    than text to continue; a model without a chat template reads it as a plain transcript."""
    return not isinstance(prompt, str) or config.use_chat_template


def default_query(prompt: PromptLike) -> str:
    """The prompt itself, or for messages the conversation's query (:func:`retrieval_query`)."""
    if isinstance(prompt, str):
        return prompt
    return retrieval_query(prompt) or (str(prompt[-1].get("content") or "") if prompt else "")


def with_transcript_stop(tokenizer: Any, prompt: PromptLike, config: NestConfig) -> NestConfig:
    """``config``, plus the stop string :data:`~nest_integrations.policy.conversation.TRANSCRIPT_STOP` when
    the prompt is read as a plain transcript: a base model writes the user's next turn itself."""
    if is_chat(prompt, config) and not getattr(tokenizer, "chat_template", None):
        if TRANSCRIPT_STOP not in config.stop:
            return config.updated(stop=[*config.stop, TRANSCRIPT_STOP])
    return config


def format_prompt(tokenizer: Any, prompt: PromptLike, config: NestConfig, context: Sequence[Passage] = ()) -> str:
    """The prompt text fed to the LM: the chat template (when used) around the
    messages, with ``context`` passages put before the request (rag modes).

    Raises:
        TypeError / ValueError: a malformed prompt (:func:`check_prompt`), or a
            ``system_prompt`` with a lone surrogate.
    """
    check_prompt(prompt)
    if config.system_prompt is not None:
        check_text(config.system_prompt, "system_prompt")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if context:
        block = "\n\n".join(f"[{i}] {p.title}: {p.text}" if p.title else f"[{i}] {p.text}" for i, p in enumerate(context, 1))
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
        messages[last_user] = {
            **messages[last_user],
            "content": f"Use these passages:\n{block}\n\n{messages[last_user]['content']}",
        }
    if not is_chat(prompt, config):
        return "\n\n".join(m["content"] for m in messages)
    if not getattr(tokenizer, "chat_template", None):  # a base model: the conversation as plain text
        return plain_transcript(messages, config.system_prompt)
    if config.system_prompt is not None and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": config.system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(lm: Any, eos_ids: set[int], text: str, config: NestConfig, stats: GenerationStats, *, strict: bool = True) -> list[int]:
    """Token ids of the formatted prompt ``text`` for the LM ``lm``, cut so the generation fits the context.

    A prompt longer than ``config.max_prompt_tokens`` or than the context leaves
    after ``config.max_new_tokens`` keeps its last tokens (``stats.prompt_truncated``,
    with a warning), so prompt plus generated tokens never exceed the context
    length and the generation stops inside it. An empty prompt starts from BOS (or
    the first of ``eos_ids`` when the tokenizer has none).

    Raises:
        ValueError: (``strict``) ``max_new_tokens`` leaves room for fewer than
            ``min(prompt tokens, MIN_PROMPT_TOKENS)`` prompt tokens. Without
            ``strict`` (scoring, which generates nothing) the prompt keeps that
            minimum and the scored continuation is what fits after it.
    """
    tokenizer = lm.tokenizer
    ids = tokenizer(text, add_special_tokens=not text.startswith(tokenizer.bos_token or "\0"))["input_ids"]
    if not ids:  # empty plain-text prompt: start from BOS (or EOS when there is none)
        start = tokenizer.bos_token_id
        ids = [start if start is not None else next(iter(eos_ids), 0)]
    context = lm.context_length
    room = context - config.max_new_tokens
    needed = min(len(ids), MIN_PROMPT_TOKENS)
    if room < needed:
        if strict:
            raise ValueError(
                f"max_new_tokens={config.max_new_tokens} does not fit the model's context of {context} tokens "
                f"with this prompt of {len(ids)} tokens (at least {needed} of them are kept); "
                f"use max_new_tokens <= {context - needed}"
            )
        room = needed
    limit = min(config.max_prompt_tokens or room, room)
    if len(ids) > limit:
        logger.warning("prompt has %d tokens; keeping its last %d", len(ids), limit)
        ids = ids[-limit:]
        stats.prompt_truncated = True
    stats.prompt_tokens = len(ids)
    return ids


def eos_token_ids(lm: Any) -> set[int]:
    """Token ids that end a generation: the tokenizer's EOS and the model's ``generation_config`` ones."""
    ids = set()
    for source in (lm.tokenizer.eos_token_id, getattr(lm.model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids
