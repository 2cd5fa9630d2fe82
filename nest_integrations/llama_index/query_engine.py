"""NestQueryEngine: retrieve, generate with NEST, cite at span level.

``Response.source_nodes`` holds exactly the retrieved nodes the answer copied
from (with their retrieval scores, in order of first use), and
``Response.metadata`` holds:

* ``"citations"``: one dict per copied span: ``answer_start`` / ``answer_end``
  (character range in the answer), ``node_id``, ``ref_doc_id``,
  ``node_char_start`` / ``node_char_end`` (range in the node text) and
  ``text`` (the cited text, verbatim both in the answer and in the node);
* ``"nest"``: the full output contract (``NestOutput.to_dict()``).

For the conventional baselines on the same index use LlamaIndex's own engines
with a ``NestLLM`` in mode ``base``: ``index.as_query_engine(llm=...)`` (RAG) and
``CitationQueryEngine.from_args(index, llm=...)`` (prompt-based citations).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import Response
from llama_index.core.bridge.pydantic import Field
from llama_index.core.indices.base import BaseIndex
from llama_index.core.query_engine.custom import CustomQueryEngine
from llama_index.core.schema import NodeWithScore

from ..attribution import NestOutput
from .llms import NestLLM

logger = logging.getLogger(__name__)


def span_citations(output: NestOutput, nodes: Sequence[NodeWithScore]) -> list[dict[str, Any]]:
    """The citation records of ``output``'s copied spans (see the module docstring)."""
    ref_doc = {hit.node.node_id: hit.node.ref_doc_id for hit in nodes}
    return [
        {
            "answer_start": span.start,
            "answer_end": span.end,
            "node_id": span.source.id,
            "ref_doc_id": ref_doc.get(span.source.id),
            "node_char_start": span.source.char_start,
            "node_char_end": span.source.char_end,
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

    @classmethod
    def from_index(
        cls,
        index: BaseIndex,
        llm: NestLLM,
        similarity_top_k: int = 8,
        mode: Literal["nest", "ra_nest"] = "nest",
        **kwargs: Any,
    ) -> NestQueryEngine:
        """An engine over ``index.as_retriever(similarity_top_k=...)``."""
        return cls(retriever=index.as_retriever(similarity_top_k=similarity_top_k), llm=llm, mode=mode, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "NestQueryEngine"

    def _response(self, output: NestOutput, nodes: Sequence[NodeWithScore]) -> Response:
        by_id = {hit.node.node_id: hit for hit in nodes}
        cited = [by_id[source.id] for source in output.sources if source.id in by_id]
        logger.debug("answer copies from %d of %d retrieved node(s)", len(cited), len(nodes))
        return Response(
            response=output.text,
            source_nodes=cited,
            metadata={"citations": span_citations(output, nodes), "nest": output.to_dict()},
        )

    def custom_query(self, query_str: str) -> Response:
        """Retrieve for ``query_str`` and answer it with NEST."""
        nodes = self.retriever.retrieve(query_str)
        return self._response(self.llm.generate(query_str, nodes=nodes, mode=self.mode), nodes)

    async def acustom_query(self, query_str: str) -> Response:
        """Async :meth:`custom_query` (generation runs in a worker thread)."""
        nodes = await self.retriever.aretrieve(query_str)
        output = await asyncio.to_thread(self.llm.generate, query_str, nodes=nodes, mode=self.mode)
        return self._response(output, nodes)
