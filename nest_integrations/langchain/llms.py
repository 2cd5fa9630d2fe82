"""NestLLM: NEST as a LangChain text-completion model (``BaseLLM``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.llms import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from ._common import NestModelBase, areport_tokens, report_tokens

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.decoding.decoder import StreamChunk
    from nest_integrations.decoding.output import NestOutput

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
        By model name, from a loaded LM or from a saved index folder::

            from nest_integrations.langchain import NestLLM

            llm = NestLLM(model="default", retriever=store, max_new_tokens=64)
            llm = NestLLM.from_lm(lm, retriever=store.as_retriever(), mode="nest")
            llm = NestLLM.from_index("my-index/")

    Invoke:
        With the prompt as retrieval query, or another one, and any NestConfig field per call::

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
        (:func:`nest_integrations.decoding.spans.merge_spans` joins them).

    Calls run on the local model. Concurrent calls (threads, async tasks) and the
    prompts of one ``generate`` / ``batch`` decode together in shared forward
    passes (:mod:`nest_integrations.decoding.batching_service`), each with the output it gets alone;
    the async methods keep the event loop free.
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
        # Every prompt is queued as soon as it is retrieved for, so they decode in one shared batch.
        futures = [self._nest_submit(prompt, prompt, stop, kwargs) for prompt in prompts]
        return self._result([future.result() for future in futures])

    async def _agenerate(
        self,
        prompts: list[str],
        stop: Optional[list[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> LLMResult:
        outputs = await asyncio.gather(*(self._anest_generate(prompt, prompt, stop, kwargs) for prompt in prompts))
        return self._result(list(outputs))

    def _result(self, outputs: list["NestOutput"]) -> LLMResult:
        generations = [
            [Generation(text=output.text, generation_info={
                **output.to_dict(), "finish_reason": output.stats.finish_reason, "fallback_reason": output.stats.fallback_reason
            })]
            for output in outputs
        ]
        return LLMResult(generations=generations, llm_output={"model_name": self.model})

    def _stream(
        self,
        prompt: str,
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        chunks = (_generation_chunk(piece) for piece in self._nest_stream(prompt, prompt, stop, kwargs))
        yield from report_tokens(chunks, run_manager)

    async def _astream(
        self,
        prompt: str,
        stop: Optional[list[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        chunks = (_generation_chunk(piece) async for piece in self._anest_stream(prompt, prompt, stop, kwargs))
        async for chunk in areport_tokens(chunks, run_manager):
            yield chunk


def _generation_chunk(piece: "StreamChunk") -> GenerationChunk:
    info: dict[str, Any] = {"spans": [span.model_dump(mode="json") for span in piece.spans]}
    if piece.output is not None:
        contract = piece.output.to_dict()
        info.update({key: value for key, value in contract.items() if key not in _STREAMED_SEPARATELY})
    return GenerationChunk(text=piece.text, generation_info=info)
