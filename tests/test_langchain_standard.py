"""ChatNest and NestVectorStore.as_retriever() against langchain-tests' standard suites.

The unit suite and the retriever suite need no real model. The chat model
integration suite runs the real default model (SmolLM2-135M-Instruct) over a
few documents embedded with the bundled MiniLM, with a small token budget.
NEST has no tool calling, no structured output and takes text only, so those
flags are off; it cannot switch its LM per call, so no model override.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import ChatModelIntegrationTests, RetrieversIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from nest_integrations.langchain import ChatNest, NestVectorStore

TEXTS = [
    "Marie Curie was a Polish and naturalised-French physicist and chemist who conducted pioneering research on "
    "radioactivity.",
    "Alan Turing was an English mathematician, computer scientist and cryptanalyst.",
    "Ada Lovelace was an English mathematician and writer, chiefly known for her work on Charles Babbage's "
    "proposed Analytical Engine.",
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "Photosynthesis is the process by which plants use sunlight, water and carbon dioxide to make sugars.",
]


class _HonestFlags:
    """What ChatNest supports, stated once for both chat suites."""

    @property
    def chat_model_class(self) -> type[ChatNest]:
        return ChatNest

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True


class TestChatNestUnit(_HonestFlags, ChatModelUnitTests):
    """Construction, standard parameters and serialisation; the LM is never loaded."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "default"}


@pytest.fixture(scope="module")
def default_lm() -> Any:
    from nest_integrations.model.lm import load_lm

    return load_lm()


@cache
def _minilm_store() -> NestVectorStore:
    """A store of :data:`TEXTS` embedded with the bundled MiniLM (built once per session)."""
    return NestVectorStore.from_texts(TEXTS, None)


@pytest.mark.slow
class TestChatNestIntegration(_HonestFlags, ChatModelIntegrationTests):
    """The suite on the real default model, 16 new tokens per call."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "default", "retriever": _minilm_store(), "max_tokens": 16}

    @pytest.fixture
    def model(self, request: Any, default_lm: Any) -> ChatNest:
        """The suite's model fixture, on one LM loaded for the whole session."""
        extra = getattr(request, "param", None) or {}
        params = {**self.standard_chat_model_params, **self.chat_model_params, **extra}
        params.pop("model")
        return ChatNest.from_lm(default_lm, **params)


def _retriever(k: int = 4) -> BaseRetriever:
    documents = [Document(page_content=text, metadata={"n": n}) for n, text in enumerate(TEXTS)]
    store = NestVectorStore.from_documents(documents, DeterministicFakeEmbedding(size=32))
    return store.as_retriever(search_kwargs={"k": k})


class TestNestVectorStoreRetriever(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> Any:
        return _retriever

    @property
    def retriever_query_example(self) -> str:
        return "Who was Marie Curie?"
