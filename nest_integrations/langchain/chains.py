"""Helper runnables: conventional RAG, attributed NEST chains and numbered citations.

* :func:`rag_chain` -- the classic ``retriever | format_docs | prompt | llm``
  baseline (passages in the prompt, no attribution), answer plus sources; it
  takes a question or a conversation, whose follow-ups are retrieved with the
  earlier questions (:func:`history_aware_retriever`), as ``ChatNest`` does.
* :func:`history_aware_retriever` -- LangChain's history-aware retriever
  pattern: the retrieval query made from the conversation, here by NEST's rule
  (:func:`~nest_integrations.policy.conversation.retrieval_query`) rather than an LM
  rewrite, so both sides of a comparison retrieve the same passages.
* :func:`attributed_chain` -- ``prompt | ChatNest``: the answer is attributed
  span by span while decoding; the retrieval query is the question.
* :data:`cite` -- renders a NEST result as text with ``[n]`` markers after the
  copied spans and the cited documents, numbered in order of first use, with
  the lines and characters cited in each.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Mapping, Optional, Sequence, Union

from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import BaseMessage, ChatMessage, HumanMessage, convert_to_messages
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompt_values import ChatPromptValue, PromptValue
from langchain_core.prompts import BasePromptTemplate, ChatPromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.vectorstores import VectorStore

from nest_integrations.decoding.output import NestOutput
from nest_integrations.decoding.rendering import marked_spans, model_note, place_markers, source_listing
from nest_integrations.policy.conversation import retrieval_query
from .chat_models import ChatNest

RAG_PROMPT = PromptTemplate.from_template(
    "Answer the question using the context.\n\nContext:\n{context}\n\nQuestion: {question}"
)
"""Default prompt of :func:`rag_chain` (variables ``context`` and ``question``)."""

QUESTION_PROMPT = ChatPromptTemplate.from_messages([("human", "{question}")])
"""Default prompt of :func:`attributed_chain` (variable ``question``)."""


_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


def format_docs(docs: Sequence[Document]) -> str:
    """Documents as numbered context blocks, ``[n] title: text``, separated by blank lines.

    Only the ``title`` metadata and the text reach the LM: a file path, a document
    id or any other metadata would be echoed into answers (and costs prompt tokens).
    """
    blocks = []
    for n, doc in enumerate(docs, start=1):
        title = doc.metadata.get("title")
        blocks.append(f"[{n}] {title}: {doc.page_content}" if title else f"[{n}] {doc.page_content}")
    return "\n\n".join(blocks)


def conversation_of(inputs: Any) -> list[BaseMessage]:
    """A question string or a conversation (anything ``convert_to_messages`` takes:
    messages, ``(role, text)`` pairs, ``{"role", "content"}`` dicts) as LangChain messages.

    Raises:
        ValueError: no messages, or the last message is not the user's (the question).
    """
    messages = [HumanMessage(inputs)] if isinstance(inputs, str) else convert_to_messages(inputs)
    if not messages or not (messages[-1].type == "human" or (isinstance(messages[-1], ChatMessage) and messages[-1].role == "user")):
        raise ValueError("a conversation must end with the user's question (a human message)")
    return messages


def conversation_query(messages: Sequence[BaseMessage]) -> str:
    """The retrieval query of a conversation: its last human message, preceded by the
    earlier human turns when it is a follow-up (:func:`~nest_integrations.policy.conversation.retrieval_query`,
    the rule ``ChatNest`` and ``nest chat`` use)."""
    turns = [
        {"role": message.role if isinstance(message, ChatMessage) else _ROLES.get(message.type, message.type), "content": str(message.text)}
        for message in messages
    ]
    return retrieval_query(turns) or turns[-1]["content"]


def history_aware_retriever(retriever: Union[BaseRetriever, VectorStore]) -> Runnable[Any, list[Document]]:
    """``retriever`` taking a question or a conversation: a conversation is searched with
    :func:`conversation_query` (a follow-up such as "And how do I remove it?" together with
    the earlier questions). LangChain's ``create_history_aware_retriever`` asks an LM to
    rewrite the question; this rule needs no LM call and retrieves what NEST retrieves."""
    stage = retriever.as_retriever() if isinstance(retriever, VectorStore) else retriever
    return RunnableLambda(lambda inputs: conversation_query(conversation_of(inputs)), name="conversation_query") | stage


def _llm_input(prompt: BasePromptTemplate, history: Sequence[BaseMessage], context: str, question: str) -> PromptValue:
    """``prompt`` filled with the context and question, after the conversation's earlier turns
    (a chat model reads them as messages, an LLM as their ``Human:``/``AI:`` transcript)."""
    filled = prompt.invoke({"context": context, "question": question})
    if not history:
        return filled
    return ChatPromptValue(messages=[*history, *filled.to_messages()])


def rag_chain(
    retriever: Union[BaseRetriever, VectorStore],
    llm: BaseLanguageModel[Any],
    prompt: Optional[BasePromptTemplate] = None,
) -> Runnable[Any, dict[str, Any]]:
    """Conventional retrieval-augmented generation: ``retriever | format_docs | prompt | llm``.

    It takes a question or a conversation. For a conversation the sources are
    retrieved with its retrieval query (:func:`history_aware_retriever`: a follow-up
    with the earlier questions, as ``ChatNest`` retrieves), and the LM gets the earlier
    turns followed by ``prompt`` filled with the sources and the last question, so
    NEST and RAG can be compared on follow-ups. Only the documents' titles and texts
    reach the LM (:func:`format_docs`), never their paths or ids.

    Args:
        retriever: any LangChain retriever (a vector store is wrapped with ``as_retriever()``).
        llm: any LLM or chat model, e.g. ``NestLLM(mode="base")`` or ``ChatNest(mode="base")``
            (a chat model reads a conversation's turns as messages).
        prompt: a template with ``context`` and ``question`` (default :data:`RAG_PROMPT`).

    Returns:
        A runnable taking the question string, or a list of messages ending with the
        user's question, and returning ``{"question", "query", "sources": [Document, ...], "answer": str}``
        (``question``: the last user message; ``query``: what was retrieved for, the question
        itself unless it is a follow-up).
    """
    template = prompt or RAG_PROMPT
    stage = retriever.as_retriever() if isinstance(retriever, VectorStore) else retriever

    def turn(inputs: Any) -> dict[str, Any]:
        messages = conversation_of(inputs)
        return {"question": str(messages[-1].text), "query": conversation_query(messages), "history": messages[:-1]}

    def to_llm(inputs: Mapping[str, Any]) -> PromptValue:
        return _llm_input(template, inputs["history"], format_docs(inputs["sources"]), inputs["question"])

    answer = RunnableLambda(to_llm, name="format_docs") | llm | StrOutputParser()
    chain = RunnableLambda(turn, name="conversation_query").assign(sources=itemgetter("query") | stage).assign(answer=answer)
    return chain | RunnableLambda(lambda result: {k: v for k, v in result.items() if k != "history"}, name="result")


def attributed_chain(chat: ChatNest, prompt: Optional[BasePromptTemplate] = None) -> Runnable[Any, BaseMessage]:
    """``prompt | chat`` with the question as NEST's retrieval query.

    Args:
        chat: the :class:`ChatNest` model (its retriever is the first stage).
        prompt: a template with a ``question`` variable, plus any others
            (default :data:`QUESTION_PROMPT`).

    Returns:
        A runnable taking the question string (or the prompt's input dict) and
        returning the attributed ``AIMessage`` (citations in ``content_blocks``,
        the output contract in ``response_metadata``); it streams, and ``| cite``
        renders it.
    """
    template = prompt or QUESTION_PROMPT

    def route(inputs: Any) -> Runnable[Any, BaseMessage]:
        question = inputs.get("question") if isinstance(inputs, Mapping) else inputs
        return template | (chat.bind(query=str(question)) if question is not None else chat)

    return RunnableLambda(route, name="attributed_chain")


def nest_output_of(result: Union[BaseMessage, Mapping[str, Any], NestOutput]) -> NestOutput:
    """The :class:`NestOutput` inside a ChatNest message (``response_metadata``),
    an output dict (``NestOutput.to_dict()``, e.g. a NestLLM ``generation_info``)
    or a NestOutput itself.

    Raises:
        ValueError: the value holds no NEST output contract.
    """
    if isinstance(result, NestOutput):
        return result
    contract = result.response_metadata if isinstance(result, BaseMessage) else result
    if not isinstance(contract, Mapping) or "text" not in contract or "spans" not in contract:
        raise ValueError("not a NEST result: expected a ChatNest message or a NestOutput dict with 'text' and 'spans'")
    return NestOutput.model_validate(dict(contract))


def cite_text(result: Union[BaseMessage, Mapping[str, Any], NestOutput]) -> str:
    """The answer with ``[n]`` after each copied span and ``[model]`` after text the LM wrote
    itself, then ``Sources:``, one line per document (and one that explains ``[model]``).

    ``n`` numbers the cited documents in order of first use; each source line
    names the document (file path or ``source`` / ``file_name`` / ``doc_id``
    metadata) and the lines and characters cited there, e.g.
    ``[1] docs/os.md: lines 12-14, chars 340-420``. Markers stay out of code
    and a fence a copied span leaves open is closed
    (:func:`~nest_integrations.decoding.rendering.place_markers`), so the text also
    renders as Markdown with every marker shown.
    """
    output = nest_output_of(result)
    answer = place_markers(marked_spans(output, lambda n: f"[{n}]")).strip()
    listing = source_listing(output) + [note for note in [model_note(output)] if note is not None]
    return f"{answer}\n\nSources:\n" + "\n".join(listing) if listing else answer


cite: Runnable[Any, str] = RunnableLambda(cite_text, name="cite")
"""Runnable form of :func:`cite_text`: ``attributed_chain(chat) | cite``."""
