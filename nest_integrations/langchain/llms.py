"""NestLLM: NEST as a LangChain text-completion model (``BaseLLM``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.llms import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from ._common import NestModelBase, areport_tokens, report_tokens

if TYPE_CHECKING:  # pragma: no cover
    from ..decoding import StreamChunk

_STREAMED_SEPARATELY = ("text", "spans")


class NestLLM(NestModelBase, BaseLLM):
    """Nearest Neighbor Speculative Decoding as a LangChain LLM.

    Each generation retrieves passages from ``retriever`` (a
    :class:`~nest_integrations.langchain.NestVectorStore` or any LangChain
    ``BaseRetriever`` / ``VectorStore``), looks their tokens up while decoding
    and copies verbatim spans from them, recording which characters came from
    which document.

    Setup:
        ``pip install nest-integrations[langchain]``

    Instantiate:
        .. code-block:: python

            from langchain_core.vectorstores import InMemoryVectorStore
            from nest_integrations.langchain import NestLLM

            llm = NestLLM(model="default", retriever=store, max_new_tokens=64)
            llm = NestLLM.from_lm(lm, retriever=store.as_retriever(), mode="nest")
            llm = NestLLM.from_index("my-index/")

    Invoke:
        .. code-block:: python

            llm.invoke("Who was Marie Curie?")
            llm.invoke(prompt, query="Marie Curie")  # explicit retrieval query
            llm.invoke(prompt, gamma=1e-3)            # any NestConfig field per call

    Output contract:
        ``generate()`` puts ``NestOutput.to_dict()`` (text, mode, spans with
        their source ids, metadata and character offsets, attribution ratio,
        sources, stats) in each ``Generation.generation_info``. Each streamed
        ``GenerationChunk`` carries the spans of its own text under ``"spans"``
        (character offsets into the whole output) and the last one also the
        rest of the contract; merging the chunks of a stream gives the same
        info with the spans split at chunk boundaries
        (:func:`nest_integrations.attribution.merge_spans` joins them).

    Calls run on the local model; the async methods run it in a worker thread.
    """

    @property
    def _llm_type(self) -> str:
        return "nest"

    def _generate(
        self,
        prompts: list[str],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations = []
        for prompt in prompts:
            output = self._nest_generate(prompt, prompt, stop, kwargs)
            info = {**output.to_dict(), "finish_reason": output.stats.finish_reason, "fallback_reason": output.stats.fallback_reason}
            generations.append([Generation(text=output.text, generation_info=info)])
        return LLMResult(generations=generations, llm_output={"model_name": self.model})

    def _chunks(self, prompt: str, stop: Optional[list[str]], kwargs: dict[str, Any]) -> Iterator[GenerationChunk]:
        for piece in self._nest_stream(prompt, prompt, stop, kwargs):
            yield _generation_chunk(piece)

    def _stream(
        self,
        prompt: str,
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        yield from report_tokens(self._chunks(prompt, stop, kwargs), run_manager)

    async def _astream(
        self,
        prompt: str,
        stop: Optional[list[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        async for chunk in areport_tokens(self._chunks(prompt, stop, kwargs), run_manager):
            yield chunk


def _generation_chunk(piece: "StreamChunk") -> GenerationChunk:
    info: dict[str, Any] = {"spans": [span.model_dump(mode="json") for span in piece.spans]}
    if piece.output is not None:
        contract = piece.output.to_dict()
        info.update({key: value for key, value in contract.items() if key not in _STREAMED_SEPARATELY})
    return GenerationChunk(text=piece.text, generation_info=info)
