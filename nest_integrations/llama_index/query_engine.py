"""NestQueryEngine: retrieve, generate with NEST, cite at span level.

``Response.source_nodes`` holds exactly the retrieved nodes the answer copied
from (with their retrieval scores, in order of first use), and
``Response.metadata`` holds:

* ``"citations"``: one dict per copied span: ``answer_start`` / ``answer_end``
  (character range in the answer), ``source_number`` (its document's number in
  order of first use), ``document`` (the file path or ``file_path`` /
  ``file_name`` / ``source`` / ``doc_id`` metadata), ``doc_char_start`` /
  ``doc_char_end`` and ``line_start`` / ``line_end`` (where it sits in the
  document: 1-based inclusive lines, None when unknown; see
  :func:`~nest_integrations.decoding.locations.locate`), ``node_id``, ``ref_doc_id``,
  ``chunk_char_start`` / ``chunk_char_end`` (range in the node's text, not in
  the file) and ``text`` (the cited text, verbatim both in the answer and in the
  node);
* ``"sources"``: the cited documents, once each in order of first use
  (:class:`~nest_integrations.decoding.rendering.CitedDocument` dicts: ``number``,
  ``document``, ``title`` and the cited ``locations``);
* ``"nest"``: the full output contract (``NestOutput.to_dict()``).

With ``streaming=True`` a query returns a ``StreamingResponse`` (an
``AsyncStreamingResponse`` from ``aquery``) whose ``response_gen`` yields the
text as it is accepted; once it is exhausted, ``source_nodes`` and
``metadata`` hold the same as a plain ``Response``.

For the conventional baselines on the same index use a ``NestLLM`` in mode
``base`` with :func:`~nest_integrations.llama_index.baselines.rag_query_engine`
(LlamaIndex's own RAG engine, node paths and ids kept out of the LM's prompt),
:class:`~nest_integrations.llama_index.baselines.RagChatEngine` (the same over a
conversation) or ``CitationQueryEngine.from_args(index, llm=...)`` (prompt-based citations).
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Iterator, Literal, Sequence, Union

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.base.response.schema import AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.bridge.pydantic import Field
from llama_index.core.indices.base import BaseIndex
from llama_index.core.query_engine.custom import CustomQueryEngine
from llama_index.core.schema import NodeWithScore

from nest_integrations.decoding.output import NestOutput
from nest_integrations.decoding.rendering import DocumentNumbers, cited_documents
from .llms import NestLLM

logger = logging.getLogger(__name__)


def span_citations(output: NestOutput, nodes: Sequence[NodeWithScore]) -> list[dict[str, Any]]:
    """The citation records of ``output``'s copied spans (see the module docstring)."""
    ref_doc = {hit.node.node_id: hit.node.ref_doc_id for hit in nodes}
    numbers = DocumentNumbers()
    return [
        {
            "answer_start": span.start,
            "answer_end": span.end,
            "source_number": numbers.number(span.source.location),
            "document": span.source.location.document,
            "doc_char_start": span.source.location.char_start,
            "doc_char_end": span.source.location.char_end,
            "line_start": span.source.location.line_start,
            "line_end": span.source.location.line_end,
            "node_id": span.source.id,
            "ref_doc_id": ref_doc.get(span.source.id),
            "chunk_char_start": span.source.chunk_char_start,
            "chunk_char_end": span.source.chunk_char_end,
            "text": span.text,
        }
        for span in output.copied_spans
        if span.source is not None
    ]


class NestQueryEngine(CustomQueryEngine):
    """Question answering with NEST over any LlamaIndex retriever.

    Example::

        engine = NestQueryEngine.from_index(index, llm=NestLLM("default"), similarity_top_k=8)
        response = engine.query("Tell me a bio of Marie Curie.")
        response.metadata["citations"]
    """

    retriever: BaseRetriever = Field(description="First-stage retriever; its nodes form the token datastore.")
    llm: NestLLM = Field(description="The NEST generator.")
    mode: Literal["nest", "ra_nest"] = Field(
        default="nest",
        description="'nest': passages only in the datastore; 'ra_nest': the top ones also in the prompt.",
    )
    streaming: bool = Field(
        default=False,
        description="Return a StreamingResponse whose source nodes and citations are filled in when its text ends.",
    )

    @classmethod
    def from_index(
        cls,
        index: BaseIndex,
        llm: NestLLM,
        similarity_top_k: int = 8,
        mode: Literal["nest", "ra_nest"] = "nest",
        streaming: bool = False,
        **kwargs: Any,
    ) -> NestQueryEngine:
        """An engine over ``index.as_retriever(similarity_top_k=...)``."""
        retriever = index.as_retriever(similarity_top_k=similarity_top_k)
        return cls(retriever=retriever, llm=llm, mode=mode, streaming=streaming, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "NestQueryEngine"

    def _response(self, output: NestOutput, nodes: Sequence[NodeWithScore]) -> Response:
        return Response(response=output.text, source_nodes=cited_nodes(output, nodes), metadata=response_metadata(output, nodes))

    def custom_query(self, query_str: str) -> Union[Response, StreamingResponse]:
        """Retrieve for ``query_str`` and answer it with NEST (streamed when ``streaming``)."""
        nodes = self.retriever.retrieve(query_str)
        if not self.streaming:
            return self._response(self.llm.generate(query_str, nodes=nodes, mode=self.mode), nodes)
        cited: list[NodeWithScore] = []
        metadata: dict[str, Any] = {}
        stream = self.llm.stream_complete(query_str, nodes=nodes, mode=self.mode)
        return StreamingResponse(_texts(stream, nodes, cited, metadata), source_nodes=cited, metadata=metadata)

    async def acustom_query(self, query_str: str) -> Union[Response, AsyncStreamingResponse]:
        """Async :meth:`custom_query`: decoding joins the LM's shared batch; a cancelled
        task takes its row out of the batch."""
        nodes = await self.retriever.aretrieve(query_str)
        if not self.streaming:
            output = await self.llm.agenerate(query_str, nodes=nodes, mode=self.mode)
            return self._response(output, nodes)
        cited: list[NodeWithScore] = []
        metadata: dict[str, Any] = {}
        stream = await self.llm.astream_complete(query_str, nodes=nodes, mode=self.mode)
        return AsyncStreamingResponse(_atexts(stream, nodes, cited, metadata), source_nodes=cited, metadata=metadata)


def cited_nodes(output: NestOutput, nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """The retrieved nodes ``output`` copied from, in order of first use."""
    by_id = {hit.node.node_id: hit for hit in nodes}
    cited = [by_id[source.id] for source in output.sources if source.id in by_id]
    logger.debug("answer copies from %d of %d retrieved node(s)", len(cited), len(nodes))
    return cited


def response_metadata(output: NestOutput, nodes: Sequence[NodeWithScore]) -> dict[str, Any]:
    """A ``Response``'s ``metadata``: the span citations against ``nodes``
    (:func:`span_citations`), the cited documents, and the output contract under ``"nest"``."""
    return {
        "citations": span_citations(output, nodes),
        "sources": [document.model_dump(mode="json") for document in cited_documents(output.spans)],
        "nest": output.to_dict(),
    }


def _finish(
    completion: CompletionResponse, nodes: Sequence[NodeWithScore], cited: list[NodeWithScore], metadata: dict[str, Any]
) -> None:
    """Fill a streamed response's ``cited`` nodes and ``metadata`` in place once ``completion``,
    the last one, carries the output contract."""
    if "nest" in completion.additional_kwargs:
        output = NestOutput.model_validate(completion.additional_kwargs["nest"])
        cited[:] = cited_nodes(output, nodes)
        metadata.update(response_metadata(output, nodes))


def _texts(
    completions: Iterator[CompletionResponse],
    nodes: Sequence[NodeWithScore],
    cited: list[NodeWithScore],
    metadata: dict[str, Any],
) -> Iterator[str]:
    for completion in completions:
        _finish(completion, nodes, cited, metadata)
        yield completion.delta or ""


async def _atexts(
    completions: AsyncIterator[CompletionResponse],
    nodes: Sequence[NodeWithScore],
    cited: list[NodeWithScore],
    metadata: dict[str, Any],
) -> AsyncIterator[str]:
    async for completion in completions:
        _finish(completion, nodes, cited, metadata)
        yield completion.delta or ""
