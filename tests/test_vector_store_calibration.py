"""alpha/tau of the LangChain and LlamaIndex vector stores: fitted on the store's own documents while
they are added to a store given an LM (else at the first nest generation that leaves them to
calibration), kept, saved with the store, read back on load."""

from __future__ import annotations

import json

import pytest
from hash_embedding import HashEmbedding
from langchain_core.embeddings import DeterministicFakeEmbedding
from llama_index.core import Document as LlamaDocument
from llama_index.core import StorageContext, VectorStoreIndex

import nest_integrations.index.vector_store_calibration as vector_store_calibration
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.langchain import NestLLM as LangChainLLM
from nest_integrations.langchain import NestVectorStore as LangChainStore
from nest_integrations.llama_index import NestLLM as LlamaIndexLLM
from nest_integrations.llama_index import NestVectorStore as LlamaIndexStore

# Six short how-to documents of several sentences each: every one can be cut at a sentence start.
TEXTS = {
    "routes": "Routes map a method and a URL to a handler. A route is declared with app.get or app.post. "
    "The handler receives the request and a reply object. Returning a value sends it as the response.",
    "hooks": "Hooks run at fixed points of a request's life. The onRequest hook runs first, before parsing. "
    "A hook that throws ends the request with an error. Hooks are registered with app.addHook.",
    "logging": "Logging is off by default. Pass logger: true to turn it on. Each request gets a child logger "
    "with its own id. The level can be set per route with the logLevel option.",
    "plugins": "Plugins add routes, decorators and hooks. A plugin is an async function taking the instance "
    "and options. Plugins are loaded in order with app.register. Each plugin gets its own scope.",
    "validation": "Routes can validate their input with JSON schemas. The body, querystring and params each "
    "take a schema. Invalid input is answered with status 400. Schemas are compiled once at start-up.",
    "errors": "Errors thrown in a handler are sent as JSON with their status code. A custom error handler is "
    "set with setErrorHandler. Not found routes use setNotFoundHandler. Errors are logged at level error.",
}
QUESTION = "How are routes declared?"
SHORT = {"max_new_tokens": 2}


class Spy:
    """The calibrations stores fit, and the (alpha, tau) every nest generation decodes with."""

    def __init__(self) -> None:
        self.fits: list = []
        self.used: list = []
        self.fitting = False


@pytest.fixture
def spy(monkeypatch) -> Spy:
    seen = Spy()
    fit, ensure = vector_store_calibration.calibrate, NestDecoder.ensure_calibration

    def counted(*args, **kwargs):
        seen.fitting = True  # the fit's own scoring passes are not generations of the model
        try:
            seen.fits.append(fit(*args, **kwargs))
        finally:
            seen.fitting = False
        return seen.fits[-1]

    def recorded(self, config):
        waited = ensure(self, config)
        if not seen.fitting:
            seen.used.append(self.rrc_parameters(config))
        return waited

    monkeypatch.setattr(vector_store_calibration, "calibrate", counted)
    monkeypatch.setattr(NestDecoder, "ensure_calibration", recorded)
    return seen


def check_fitted(fitted, lm) -> None:
    assert fitted.lm_fingerprint == lm.fingerprint() and fitted.passages == len(TEXTS) and fitted.tokens > 0
    assert 0.0 <= fitted.alpha <= 1.0 and fitted.tau > 0


# --------------------------------------------------------------------------- LangChain
def langchain_store(lm) -> LangChainStore:
    return LangChainStore.from_texts(
        list(TEXTS.values()), DeterministicFakeEmbedding(size=16), ids=list(TEXTS), lm=lm, show_progress=False
    )


def test_a_langchain_store_built_with_an_lm_fits_while_adding_so_the_first_question_does_not(tiny_lm, tmp_path, spy):
    store = langchain_store(tiny_lm)
    assert len(spy.fits) == 1, "adding the documents fitted alpha/tau for the store's LM"
    fitted = spy.fits[0]
    check_fitted(fitted, tiny_lm)
    folder = store.save_local(tmp_path / "store")
    assert json.loads((folder / "calibration.json").read_text())["calibrations"][tiny_lm.fingerprint()]["alpha"] == fitted.alpha
    store.add_texts(["Cookies are set with reply.setCookie. They are signed when a secret is given."])
    assert len(spy.fits) == 1, "documents added later keep the calibration"

    again = LangChainStore.load_local(folder, DeterministicFakeEmbedding(size=16), lm=tiny_lm, show_progress=False)
    for answering in (store, again):
        info = LangChainLLM.from_lm(tiny_lm, retriever=answering, **SHORT).generate([QUESTION]).generations[0][0].generation_info
        assert info["stats"]["calibration_s"] == 0.0
    assert len(spy.fits) == 1 and spy.used == [(fitted.alpha, fitted.tau)] * 2


def test_a_langchain_store_given_its_lm_by_the_model_fits_at_the_first_nest_call_keeps_and_saves_it(tiny_lm, tmp_path, spy):
    store = LangChainStore.from_texts(
        list(TEXTS.values()), DeterministicFakeEmbedding(size=16), ids=list(TEXTS), show_progress=False
    )
    folder = store.save_local(tmp_path / "store")
    llm = LangChainLLM.from_lm(tiny_lm, retriever=store, **SHORT)
    llm.invoke(QUESTION, mode="base")
    llm.invoke(QUESTION, alpha=0.3, tau=0.1)
    assert spy.fits == [] and store.calibrations == {}  # the LM alone, or explicit values: nothing to fit
    assert spy.used == [(0.3, 0.1)]

    llm.invoke(QUESTION)  # the default config leaves alpha/tau to calibration
    llm.invoke(QUESTION)
    assert len(spy.fits) == 1, "a store fits once per LM; later calls use what it kept"
    fitted = spy.fits[0]
    check_fitted(fitted, tiny_lm)
    assert store.calibrations == {tiny_lm.fingerprint(): fitted}
    assert spy.used[1:] == [(fitted.alpha, fitted.tau)] * 2
    saved = json.loads((folder / "calibration.json").read_text())  # the saved store got it at once
    assert saved["calibrations"][tiny_lm.fingerprint()]["alpha"] == fitted.alpha

    again = LangChainStore.load_local(folder, DeterministicFakeEmbedding(size=16), lm=tiny_lm, show_progress=False)
    assert again.calibrations == {tiny_lm.fingerprint(): fitted}
    LangChainLLM.from_lm(tiny_lm, retriever=again.as_retriever(), **SHORT).invoke(QUESTION)
    assert len(spy.fits) == 1 and spy.used[-1] == (fitted.alpha, fitted.tau)  # read back, not fitted again


def test_a_langchain_calibration_fitted_in_memory_is_saved_with_the_store(tiny_lm, tmp_path, spy):
    store = langchain_store(tiny_lm)
    fitted = store.calibrate(n=3, budget_s=None)
    assert fitted.passages == 3
    folder = store.save_local(tmp_path / "store")
    again = LangChainStore.load_local(folder, DeterministicFakeEmbedding(size=16), lm=tiny_lm)
    assert again.saved_calibration(tiny_lm) == fitted

    (folder / "calibration.json").write_text("{not json")  # a broken cache is fitted again, never trusted
    assert LangChainStore.load_local(folder, DeterministicFakeEmbedding(size=16), lm=tiny_lm).calibrations == {}


def test_a_store_too_short_to_fit_on_keeps_the_defaults_and_warns_once(tiny_lm, caplog, spy):
    store = LangChainStore.from_texts(["One sentence only."], DeterministicFakeEmbedding(size=16), lm=tiny_lm, show_progress=False)
    llm = LangChainLLM.from_lm(tiny_lm, retriever=store, **SHORT)
    with caplog.at_level("WARNING", logger="nest_integrations.index.vector_store_calibration"):
        llm.invoke(QUESTION)
        llm.invoke(QUESTION)
    assert store.calibrations == {} and spy.used == [(0.3, 0.1)] * 2
    assert sum("not calibrated" in r.getMessage() for r in caplog.records) == 1


# --------------------------------------------------------------------------- LlamaIndex
def llama_index(store: LlamaIndexStore) -> VectorStoreIndex:
    documents = [LlamaDocument(text=text, id_=name) for name, text in TEXTS.items()]
    storage = StorageContext.from_defaults(vector_store=store)
    return VectorStoreIndex.from_documents(documents, storage_context=storage, embed_model=HashEmbedding(dim=32))


def test_a_llama_index_store_given_an_lm_and_embed_model_fits_while_adding_so_the_first_question_does_not(tiny_lm, tmp_path, spy):
    store = LlamaIndexStore(lm=tiny_lm, embed_model=HashEmbedding(dim=32), show_progress=False)
    index = llama_index(store)
    assert len(spy.fits) == 1, "adding the nodes fitted alpha/tau for the store's LM"
    fitted = spy.fits[0]
    check_fitted(fitted, tiny_lm)
    index.storage_context.persist(str(tmp_path))
    saved = json.loads((tmp_path / "default__vector_store.calibration.json").read_text())
    assert saved["calibrations"][tiny_lm.fingerprint()]["tau"] == fitted.tau

    response = LlamaIndexLLM(tiny_lm, retriever=index, **SHORT).complete(QUESTION)
    assert response.additional_kwargs["nest"]["stats"]["calibration_s"] == 0.0
    assert len(spy.fits) == 1 and spy.used == [(fitted.alpha, fitted.tau)]


def test_a_llama_index_store_fits_at_the_first_nest_call_keeps_and_persists_it(tiny_lm, tmp_path, spy):
    store = LlamaIndexStore(lm=tiny_lm, show_progress=False)
    index = llama_index(store)
    index.storage_context.persist(str(tmp_path))
    llm = LlamaIndexLLM(tiny_lm, retriever=index, **SHORT)
    llm.complete(QUESTION, mode="base")
    llm.complete(QUESTION, alpha=0.3, tau=0.1)
    assert spy.fits == [] and store.calibrations == {}

    llm.complete(QUESTION)
    llm.complete(QUESTION)
    assert len(spy.fits) == 1
    fitted = spy.fits[0]
    check_fitted(fitted, tiny_lm)
    assert spy.used == [(0.3, 0.1)] + [(fitted.alpha, fitted.tau)] * 2
    saved = json.loads((tmp_path / "default__vector_store.calibration.json").read_text())
    assert saved["calibrations"][tiny_lm.fingerprint()]["tau"] == fitted.tau

    again = LlamaIndexStore.from_persist_dir(str(tmp_path), lm=tiny_lm)
    assert again.calibrations == {tiny_lm.fingerprint(): fitted}
    reloaded = VectorStoreIndex.from_vector_store(again, embed_model=HashEmbedding(dim=32))
    LlamaIndexLLM(tiny_lm, retriever=reloaded, **SHORT).complete(QUESTION)
    assert len(spy.fits) == 1 and spy.used[-1] == (fitted.alpha, fitted.tau)

    LlamaIndexStore(lm=tiny_lm).persist(str(tmp_path / "default__vector_store.json"))  # another store in its place
    assert not (tmp_path / "default__vector_store.calibration.json").exists()


# --------------------------------------------------------------------------- files that cannot be trusted
def write_calibration(path, lm, **values) -> None:
    """A calibration file holding one entry for ``lm`` with ``values`` in place of fitted ones (NaN and
    infinities as Python's json writes them)."""
    quantiles = {"0.1": 0.1, "0.5": 0.2, "0.9": 0.3}
    entry = {
        "lm_name": lm.name, "lm_fingerprint": lm.fingerprint(), "alpha": 0.25, "tau": 0.05, "separating_alpha": 0.3,
        "balanced_accuracy": 0.8, "known_ratio_quantiles": quantiles, "unknown_ratio_quantiles": quantiles,
        "passages": 4, "tokens": 100, "seconds": 1.0, **values,
    }
    path.write_text(json.dumps({"format": "nest-calibration", "version": 1, "calibrations": {lm.fingerprint(): entry}}))


@pytest.mark.parametrize("values", [{"alpha": float("nan")}, {"alpha": float("inf")}, {"tau": float("inf")}, {"tau": 1e-300}])
def test_a_store_calibration_not_finite_or_out_of_bounds_is_refitted_with_a_warning(tiny_lm, tmp_path, values, caplog):
    folder = langchain_store(tiny_lm).save_local(tmp_path / "store")
    write_calibration(folder / "calibration.json", tiny_lm, **values)
    with caplog.at_level("WARNING", logger="nest_integrations.policy.calibration"):
        store = LangChainStore.load_local(folder, DeterministicFakeEmbedding(size=16), lm=tiny_lm, show_progress=False)
    assert store.calibrations == {} and any("calibrated again" in r.getMessage() for r in caplog.records)

    llama = LlamaIndexStore(lm=tiny_lm, show_progress=False)
    llama_index(llama).storage_context.persist(str(tmp_path / "llama"))
    write_calibration(tmp_path / "llama" / "default__vector_store.calibration.json", tiny_lm, **values)
    assert LlamaIndexStore.from_persist_dir(str(tmp_path / "llama"), lm=tiny_lm).calibrations == {}


def test_a_store_calibration_file_that_is_a_folder_is_an_error_naming_it(tiny_lm, tmp_path):
    folder = langchain_store(tiny_lm).save_local(tmp_path / "store")
    (folder / "calibration.json").unlink()  # the fit made while adding, saved with the store
    (folder / "calibration.json").mkdir()
    with pytest.raises(ValueError, match="calibration.json is not a regular file"):
        LangChainStore.load_local(folder, DeterministicFakeEmbedding(size=16), lm=tiny_lm)

    llama = LlamaIndexStore(lm=tiny_lm, show_progress=False)
    llama_index(llama).storage_context.persist(str(tmp_path / "llama"))
    (tmp_path / "llama" / "default__vector_store.calibration.json").mkdir()
    with pytest.raises(ValueError, match="default__vector_store.calibration.json is not a regular file"):
        LlamaIndexStore.from_persist_dir(str(tmp_path / "llama"), lm=tiny_lm)


def test_a_store_saved_over_keeps_the_old_stores_fit_out_of_its_folder(tiny_lm, tmp_path, spy):
    old = langchain_store(tiny_lm)
    folder = old.save_local(tmp_path / "store")
    LangChainStore.from_texts(["Another store. It is saved in the same place."], DeterministicFakeEmbedding(size=16), lm=tiny_lm, show_progress=False).save_local(folder, overwrite=True)
    fitted = old.calibrate(n=2, budget_s=None)
    assert old.calibrations == {tiny_lm.fingerprint(): fitted}
    assert not (folder / "calibration.json").exists(), "the other store got this store's calibration"

    llama = LlamaIndexStore(lm=tiny_lm, show_progress=False)
    index = llama_index(llama)
    index.storage_context.persist(str(tmp_path / "llama"))
    LlamaIndexStore(lm=tiny_lm).persist(str(tmp_path / "llama" / "default__vector_store.json"))  # another store in its place
    llama.calibrate(tiny_lm, HashEmbedding(dim=32), n=2, budget_s=None)
    assert not (tmp_path / "llama" / "default__vector_store.calibration.json").exists()
