"""The decoder an integration's model builds for each call, over its first stage.

LangChain's ``NestLLM`` / ``ChatNest`` and LlamaIndex's ``NestLLM`` (which its
``NestChatEngine`` answers through) retrieve from a framework's retriever. When
that retriever searches the integration's own ``NestVectorStore``, the decoder
uses the store's token datastore and its calibration for the LM (fitted on the
store's documents at the first nest generation that leaves alpha or tau to
calibration, when the store has none yet); any other retriever gets the model's
own datastore, which encodes retrieved passages lazily. Building a decoder is
cheap, so the models build one per call, and one built now sees the store as it
is now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.core.config import NestConfig
    from nest_integrations.core.similarity import Relevance
    from nest_integrations.decoding.decoder import NestDecoder
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.policy.calibration import Calibration
    from nest_integrations.retrieval.base import PassageRetriever
    from nest_integrations.store.datastore import TokenDatastore


class CalibratedStore(Protocol):
    """What the decoder takes of a ``NestVectorStore`` (either integration's): its token datastore for
    an LM, and the calibration it holds for that LM, if any."""

    def token_datastore(self, lm: "LoadedLM") -> "TokenDatastore":
        """The store's token datastore, keyed by ``lm``."""
        ...

    def saved_calibration(self, lm: "LoadedLM") -> Optional["Calibration"]:
        """The store's calibration for ``lm``, without fitting one (None: none yet)."""
        ...


StoreT = TypeVar("StoreT", bound=CalibratedStore)


def integration_decoder(
    lm: "LoadedLM",
    config: Optional["NestConfig"],
    *,
    retriever: Optional["PassageRetriever"],
    relevance: Optional["Relevance"],
    store: Optional[StoreT],
    calibrate: Callable[[StoreT, "LoadedLM"], Optional["Calibration"]],
    own_datastore: Callable[["LoadedLM"], "TokenDatastore"],
) -> "NestDecoder":
    """A decoder for one call of an integration's model.

    Args:
        retriever: the decoder's own first stage; None when the model retrieves itself and hands
            the decoder its passages.
        relevance: the relevance gate's and answer windows' cosine of texts to a query.
        store: the ``NestVectorStore`` the model's retriever searches, None for any other retriever.
        calibrate: ``store``'s calibration for the LM, fitted on its documents when it has none
            (called at the first nest generation that needs it, not now).
        own_datastore: the model's own datastore for the LM, used when there is no ``store``.
    """
    from nest_integrations.decoding.decoder import NestDecoder

    if store is None:
        return NestDecoder(lm, own_datastore(lm), retriever, config, relevance=relevance)
    # alpha/tau left to calibration: the store's for this LM, else fitted on its documents at the first nest call.
    return NestDecoder(
        lm, store.token_datastore(lm), retriever, config, relevance=relevance,
        calibration=store.saved_calibration(lm), calibrator=lambda: calibrate(store, lm),
    )
