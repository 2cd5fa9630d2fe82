"""Helper runnables: conventional RAG, attributed NEST chains and numbered citations.

* :func:`rag_chain` -- the classic ``retriever | format_docs | prompt | llm``
  baseline (passages in the prompt, no attribution), answer plus sources.
* :func:`attributed_chain` -- ``prompt | ChatNest``: the answer is attributed
  span by span while decoding; the retrieval query is the question.
* :data:`cite` -- renders a NEST result as text with ``[n]`` markers after the
  copied spans and a numbered source list.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import BasePromptTemplate, ChatPromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnablePassthrough
from langchain_core.vectorstores import VectorStore

from ..attribution import NestOutput
from .chat_models import ChatNest

RAG_PROMPT = PromptTemplate.from_template(
    "Answer the question using the context.\n\nContext:\n{context}\n\nQuestion: {question}"
)
"""Default prompt of :func:`rag_chain` (variables ``context`` and ``question``)."""

QUESTION_PROMPT = ChatPromptTemplate.from_messages([("human", "{question}")])
"""Default prompt of :func:`attributed_chain` (variable ``question``)."""


def format_docs(docs: Sequence[Document]) -> str:
    """Documents as numbered context blocks, ``[n] title: text``, separated by blank lines."""
    blocks = []
    for n, doc in enumerate(docs, start=1):
        title = doc.metadata.get("title")
        blocks.append(f"[{n}] {title}: {doc.page_content}" if title else f"[{n}] {doc.page_content}")
    return "\n\n".join(blocks)


def rag_chain(
    retriever: Union[BaseRetriever, VectorStore],
    llm: BaseLanguageModel[Any],
    prompt: Optional[BasePromptTemplate] = None,
) -> Runnable[str, dict[str, Any]]:
    """Conventional retrieval-augmented generation: ``retriever | format_docs | prompt | llm``.

    Args:
        retriever: any LangChain retriever (a vector store is wrapped with ``as_retriever()``).
        llm: any LLM or chat model, e.g. ``NestLLM(mode="base")``.
        prompt: a template with ``context`` and ``question`` (default :data:`RAG_PROMPT`).

    Returns:
        A runnable taking the question string and returning
        ``{"question", "sources": [Document, ...], "answer": str}``.
    """
    stage = retriever.as_retriever() if isinstance(retriever, VectorStore) else retriever
    to_prompt_inputs = RunnableLambda(
        lambda inputs: {"context": format_docs(inputs["sources"]), "question": inputs["question"]}, name="format_docs"
    )
    answer = to_prompt_inputs | (prompt or RAG_PROMPT) | llm | StrOutputParser()
    return RunnableParallel(question=RunnablePassthrough(), sources=stage).assign(answer=answer)


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
    """The answer with ``[n]`` after each copied span, then ``Sources:`` numbered in order of use."""
    output = nest_output_of(result)
    numbers = {source.id: n for n, source in enumerate(output.sources, start=1)}
    parts = []
    for span in output.spans:
        if span.copied and span.source is not None and span.source.id in numbers:
            body = span.text.rstrip()
            parts.append(f"{body}[{numbers[span.source.id]}]{span.text[len(body):]}")
        else:
            parts.append(span.text)
    answer = "".join(parts).strip()
    if not numbers:
        return answer
    listing = "\n".join(
        f"[{n}] {source.title} ({source.id})" if source.title else f"[{n}] {source.id}"
        for n, source in enumerate(output.sources, start=1)
    )
    return f"{answer}\n\nSources:\n{listing}"


cite: Runnable[Any, str] = RunnableLambda(cite_text, name="cite")
"""Runnable form of :func:`cite_text`: ``attributed_chain(chat) | cite``."""
