"""NestVectorStore against langchain-tests' standard VectorStore suite (sync and async)."""

from __future__ import annotations

from typing import Iterator

import pytest
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from nest_integrations.langchain import NestVectorStore


class TestNestVectorStore(VectorStoreIntegrationTests):
    """The suite on a store without an LM (the token datastore never built)."""

    @pytest.fixture()
    def vectorstore(self) -> Iterator[VectorStore]:
        store = NestVectorStore(self.get_embeddings())
        try:
            yield store
        finally:
            store.delete()


class TestNestVectorStoreWithDatastore(VectorStoreIntegrationTests):
    """The suite again with the token datastore live, checking after every test
    that it holds exactly the store's documents."""

    @pytest.fixture()
    def vectorstore(self, tiny_lm) -> Iterator[VectorStore]:
        store = NestVectorStore(self.get_embeddings(), tiny_lm)
        store.token_datastore()
        try:
            yield store
        finally:
            live = {doc.id: doc.page_content for doc in store.similarity_search("any", k=len(store))}
            assert {p.id: p.text for p in store.token_datastore().live_passages()} == live
            store.delete()
