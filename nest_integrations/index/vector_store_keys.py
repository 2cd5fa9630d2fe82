"""A vector store bound to one LM: its token datastore, and its keys precomputed, saved and memory-mapped.

The LangChain and LlamaIndex ``NestVectorStore`` each hold one :class:`VectorStoreKeys`
and know nothing of each other. It does what both need:

* binds the store to one LM (given to the store, or adopted from the first
  model that retrieves from it) and refuses another LM with a clear error;
* keeps a :class:`~nest_integrations.store.datastore.TokenDatastore` in sync with the
  store's documents (:meth:`VectorStoreKeys.added`, :meth:`VectorStoreKeys.removed`);
* with ``precompute=True`` encodes the keys of new documents as they are added
  (batched, with a progress bar and a time estimate:
  :class:`~nest_integrations.store.encode_progress.EncodeProgress`); a later addition
  appends a segment of keys (:class:`~nest_integrations.store.key_sources.KeySegments`), earlier keys stay where they
  are (memory-mapped ones stay mapped);
* gives the arrays to save (:meth:`VectorStoreKeys.keys_to_save`: one
  :class:`~nest_integrations.store.key_sources.PrecomputedKeys` in the store's document
  order, removed documents' keys dropped) with a :class:`SavedKeysInfo` for the
  store's manifest, and takes saved ones back (:meth:`VectorStoreKeys.attach_saved`),
  checked against the LM that binds them (weights, tokenizer, key layer,
  encoding prefix) before any is used.

A first stage that cannot list its documents (a foreign vector store, any
retriever) gets :func:`lazy_datastore` instead: the same binding to one LM, over
a datastore that starts empty and takes each passage as it is retrieved.

Locking: the store passes its own lock. Every change of the datastore happens
under it; LM forwards run outside it (one encoding at a time), so searches go
on while keys are being encoded.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from typing_extensions import Annotated

from nest_integrations.corpus.passages import Passage
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encode_progress import EncodeProgress
from nest_integrations.store.encoder import EncodedPassage, PassageEncoder
from nest_integrations.store.codec_base import Float16Codec
from nest_integrations.store.key_sources import KeySegments, PrecomputedKeys

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.lm import LoadedLM

logger = logging.getLogger(__name__)


def lazy_datastore(
    lm: "LoadedLM",
    *,
    key_layer: str = "ffn_input",
    encoding_prefix: Optional[str] = "auto",
    cache_mb: float = 1024.0,
) -> TokenDatastore:
    """A token datastore keyed by ``lm`` that starts empty, for a first stage that cannot list its documents.

    The decoder adds each passage its first stage returns; ``lm`` encodes the
    passage the first time it is searched, and its keys stay in an LRU cache of
    ``cache_mb`` megabytes (``2 * hidden_size`` bytes per token). What both
    integrations' models build for a retriever other than their ``NestVectorStore``,
    and :func:`~nest_integrations.index.foreign_store.store_decoder` for a foreign store.

    Args:
        key_layer: layer read as keys (``"ffn_input"`` or ``"layer:<i>"``).
        encoding_prefix: see :func:`nest_integrations.store.encoder.resolve_encoding_prefix`.
    """
    return TokenDatastore([], PassageEncoder(lm, key_layer, encoding_prefix), cache_mb=cache_mb)


class SavedKeysInfo(BaseModel):
    """The ``keys`` entry of a store manifest: what the saved keys were encoded with, and their size."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    lm_name: StrictStr = Field(description="Name of the LM that encoded the keys (for messages).")
    lm_fingerprint: StrictStr = Field(description="Its weights' digest (:func:`nest_integrations.model.lm.model_fingerprint`).")
    tokenizer_fingerprint: StrictStr = Field(description="Its tokenizer's digest; token ids mean nothing under another.")
    key_layer: StrictStr = Field(description="Layer the keys were read from ('ffn_input' or 'layer:<i>').")
    encoding_prefix_text: StrictStr = Field(description="Literal text encoded before every passage.")
    max_passage_tokens: Annotated[StrictInt, Field(ge=2, description="Longest window encoded in one forward.")]
    window_overlap: Annotated[StrictInt, Field(ge=1, description="Tokens of left context a later window repeats.")]
    hidden_size: Annotated[StrictInt, Field(ge=1, description="Width of each key.")]
    dtype: Literal["float16"] = Field(default="float16", description="How the keys are stored.")
    encoded_in: StrictStr = Field(
        default="float32",
        description="Precision of the forward that computed them (nest_integrations.store.key_precision); not checked: "
        "keys appended on a machine that encodes in another precision agree with these on nearly every neighbour.",
    )
    tokens: Annotated[StrictInt, Field(ge=0, description="Rows of the key arrays.")]
    entries: Annotated[StrictInt, Field(ge=0, description="Rows that are datastore entries (valid).")]


def keys_info(encoder: PassageEncoder, keys: PrecomputedKeys) -> SavedKeysInfo:
    """The manifest entry of ``keys`` encoded by ``encoder`` (fingerprints the LM, once per model)."""
    from nest_integrations.store.key_precision import encoding_dtype

    lm = encoder.lm
    return SavedKeysInfo(
        lm_name=lm.name,
        lm_fingerprint=lm.fingerprint(),
        tokenizer_fingerprint=lm.tokenizer_fingerprint(),
        key_layer=encoder.key_layer,
        encoding_prefix_text=encoder.prefix_text,
        max_passage_tokens=encoder.max_passage_tokens,
        window_overlap=encoder.window_overlap,
        hidden_size=lm.hidden_size,
        encoded_in=str(encoding_dtype(lm)).removeprefix("torch."),
        tokens=keys.num_tokens,
        entries=keys.num_entries,
    )


def check_keys_fit(info: SavedKeysInfo, encoder: PassageEncoder, where: str) -> None:
    """Raise ValueError, naming what differs, unless keys described by ``info`` match ``encoder``'s hidden states.

    Args:
        where: the saved store, for the message.
    """
    from nest_integrations.model.lm import fingerprints_match

    lm = encoder.lm
    if not fingerprints_match(info.lm_fingerprint, lm.fingerprint()):
        raise ValueError(
            f"{where}: its token keys were encoded by LM {info.lm_name!r} (fingerprint {info.lm_fingerprint}); "
            f"{lm.name!r} has other weights (fingerprint {lm.fingerprint()}), so they would not match its hidden "
            "states. Load the store with the LM that saved it, or with load_keys=False to encode keys again."
        )
    if info.tokenizer_fingerprint != lm.tokenizer_fingerprint():
        raise ValueError(f"{where}: its token keys were encoded with another tokenizer than {lm.name!r}'s")
    settings = {
        "key_layer": (info.key_layer, encoder.key_layer),
        "encoding prefix": (info.encoding_prefix_text, encoder.prefix_text),
        "max_passage_tokens": (info.max_passage_tokens, encoder.max_passage_tokens),
        "window_overlap": (info.window_overlap, encoder.window_overlap),
        "hidden_size": (info.hidden_size, lm.hidden_size),
    }
    for name, (saved, wanted) in settings.items():
        if saved != wanted:
            raise ValueError(f"{where}: its token keys were encoded with {name} {saved!r}, this store encodes with {wanted!r}")


def _no_keys(width: int) -> EncodedPassage:
    """A passage of no tokens: the place of a removed or replaced document in appended keys."""
    return EncodedPassage(
        np.zeros(0, np.int32), np.zeros((0, 2), np.int32), np.zeros((0, width), np.float16), np.zeros(0, np.bool_)
    )


@dataclass
class _SavedKeys:
    """Keys read from a saved store, waiting for the LM that will check and use them."""

    passages: list[Passage]
    keys: PrecomputedKeys
    info: SavedKeysInfo
    where: str


class VectorStoreKeys:
    """The LM, token datastore and keys of one vector store (see the module docstring).

    Args:
        live: the store's documents as passages, in the store's order; called
            with ``lock`` held.
        lock: the store's lock (re-entrant).
        lm: the LM keying the datastore; None: adopted on first use.
        key_layer: layer read as keys (``"ffn_input"`` or ``"layer:<i>"``).
        encoding_prefix: see :func:`nest_integrations.store.encoder.resolve_encoding_prefix`.
        cache_mb: bound of the datastore's cache of lazily encoded keys.
        precompute: encode keys when documents are added (once an LM is bound;
            at binding for documents added before); False encodes a document the
            first time it is retrieved for a generation.
        show_progress: draw a progress bar while precomputing.
        owner: the store's class name, for messages.
    """

    def __init__(
        self,
        live: Callable[[], list[Passage]],
        lock: "threading.RLock",
        *,
        lm: Optional["LoadedLM"] = None,
        key_layer: str = "ffn_input",
        encoding_prefix: Optional[str] = "auto",
        cache_mb: float = 1024.0,
        precompute: bool = True,
        show_progress: bool = True,
        owner: str = "NestVectorStore",
    ):
        self._live = live
        self._lock = lock
        self._lm = lm
        self.key_layer = key_layer
        self.encoding_prefix = encoding_prefix
        self.cache_mb = cache_mb
        self.precompute = precompute
        self.show_progress = show_progress
        self.owner = owner
        self._datastore: Optional[TokenDatastore] = None
        self._saved: Optional[_SavedKeys] = None
        self._encoding = threading.Lock()  # one encoding at a time; the store's lock is free meanwhile

    @property
    def lm(self) -> Optional["LoadedLM"]:
        return self._lm

    def passages(self) -> list[Passage]:
        """The store's documents as passages, in the store's order (a snapshot, taken under the store's lock)."""
        with self._lock:
            return self._live()

    @property
    def bound(self) -> bool:
        """Whether the token datastore exists (an LM has been bound)."""
        return self._datastore is not None

    # ------------------------------------------------------------------ binding
    def datastore(self, lm: Optional["LoadedLM"] = None) -> TokenDatastore:
        """The token datastore over the store's documents, created on first use.

        With ``precompute`` the keys of documents not encoded yet are encoded
        before it is returned (the store's lock is not held meanwhile).

        Args:
            lm: the LM to key it with; adopted when the store has none yet.

        Raises:
            ValueError: no LM at all; an LM other than the store's; or saved keys
                that another LM (or tokenizer, key layer, prefix) encoded.
        """
        datastore = self.bind(lm)
        if self.precompute:
            self.encode_missing(wait=False)  # another caller encoding: its passages are served lazily meanwhile
        return datastore

    def bind(self, lm: Optional["LoadedLM"] = None) -> TokenDatastore:
        """The datastore, created on first use; encodes nothing (see :meth:`datastore`)."""
        with self._lock:
            if lm is not None and lm is not self._lm:
                if self._lm is None:
                    self._lm = lm
                elif lm.fingerprint() != self._lm.fingerprint():
                    raise ValueError(
                        f"this {self.owner} keys its token datastore with LM {self._lm.name!r}; it cannot serve "
                        f"{lm.name!r}, which has other weights. Use one LM for the store and the model."
                    )
            if self._lm is None:
                raise ValueError(f"the {self.owner} has no LM: pass lm= to the store or to token_datastore()")
            if self._datastore is None:
                self._datastore = self._create(self._lm)
            return self._datastore

    def encode_all(self, lm: Optional["LoadedLM"] = None, *, show_progress: Optional[bool] = None) -> int:
        """Bind ``lm`` (see :meth:`bind`) and encode now the keys of every document that has none,
        whatever ``precompute`` says: a store's ``precompute_token_keys``. Call without the store's
        lock; returns how many documents were encoded (after any encoding already running).

        Args:
            show_progress: None: the store's setting.
        """
        self.bind(lm)
        return self.encode_missing(show_progress=show_progress)

    def _create(self, lm: "LoadedLM") -> TokenDatastore:
        """A datastore over the live passages, serving saved keys when there are some (lock held)."""
        encoder = PassageEncoder(lm, self.key_layer, self.encoding_prefix)
        live = self._live()
        saved = self._saved
        if saved is None:
            return TokenDatastore(live, encoder, cache_mb=self.cache_mb)
        check_keys_fit(saved.info, encoder, saved.where)
        if saved.keys.num_tokens and int(saved.keys.token_ids.max()) >= len(lm.tokenizer):
            raise ValueError(f"{saved.where}: its saved token ids fall outside {lm.name!r}'s vocabulary of {len(lm.tokenizer)}")
        datastore = TokenDatastore(saved.passages, encoder, cache_mb=self.cache_mb)
        datastore.attach_precomputed(saved.keys)
        # Documents changed since loading: same text keeps its saved keys, new text gets a fresh slot.
        for passage in live:
            datastore.add(passage)
        live_ids = {p.id for p in live}
        datastore.remove([p.id for p in saved.passages if p.id not in live_ids])
        self._saved = None
        logger.info("%s: %d saved token keys memory-mapped for %s", self.owner, saved.keys.num_tokens, lm.name)
        return datastore

    # ------------------------------------------------------------------ following the store
    def added(self, passages: Iterable[Passage]) -> None:
        """Documents added or replaced in the store (lock held): they enter the datastore.

        Call :meth:`after_add` once the store's lock is released.
        """
        if self._datastore is not None:
            for passage in passages:
                self._datastore.add(passage)

    def after_add(self) -> None:
        """With ``precompute`` and an LM: bind (when not yet) and encode the new documents' keys,
        after any encoding already running. Call without the store's lock."""
        if self.precompute and self._lm is not None:
            self.bind(None)
            self.encode_missing()

    def removed(self, ids: Sequence[str]) -> None:
        """Documents deleted from the store (lock held): they leave the datastore and are not saved again."""
        if self._datastore is not None:
            self._datastore.remove(ids)

    def encode_missing(self, *, show_progress: Optional[bool] = None, wait: bool = True) -> int:
        """Encode the keys of every datastore slot past the precomputed ones and append them.

        Slots of removed or replaced documents get no tokens. Call without the
        store's lock; returns how many passages were encoded.

        Args:
            show_progress: None: the store's setting.
            wait: wait for an encoding already running (False: return 0 at once).
        """
        if not self._encoding.acquire(blocking=wait):
            return 0
        try:
            with self._lock:
                datastore = self._datastore
                if datastore is None:
                    return 0
                before = datastore.precomputed
                covered = before.num_passages if before is not None else 0
                slots = range(covered, len(datastore.passages))
                todo = [i for i in slots if datastore.index_of(datastore.passages[i].id) == i]
                texts = [datastore.passages[i].text for i in todo]
            if not slots:
                return 0
            encoded: dict[int, EncodedPassage] = {}
            if todo:
                with EncodeProgress(
                    datastore.encoder, texts, desc=f"Encoding {self.owner} keys",
                    show_progress=self.show_progress if show_progress is None else show_progress,
                ) as progress:
                    encoded = dict(zip(todo, progress.encode()))
            width = datastore.hidden_size
            new = PrecomputedKeys.from_encoded([encoded[i] if i in encoded else _no_keys(width) for i in slots], datastore.encoder)
            with self._lock:
                if self._datastore is datastore:
                    datastore.attach_precomputed(KeySegments.joined(before, new))
            return len(todo)
        finally:
            self._encoding.release()

    # ------------------------------------------------------------------ persistence
    def keys_to_save(self, passages: Sequence[Passage]) -> Optional[tuple[PrecomputedKeys, SavedKeysInfo]]:
        """The precomputed keys of ``passages`` (the store's documents, in the order
        saved) and their manifest entry; None when some passage has none (nothing
        is encoded here: see :meth:`encode_missing`). Call with the lock held.

        The arrays are gathered into memory (``tokens x hidden_size`` float16 keys).
        """
        if self._datastore is not None:
            pre = self._datastore.precomputed
            rows = [self._datastore.index_of(p.id) for p in passages]
            if pre is None or any(i is None or i >= pre.num_passages for i in rows):
                return None
            source, encoder = pre, self._datastore.encoder
        elif self._saved is not None:
            saved = self._saved
            where = {(p.id, p.text): i for i, p in enumerate(saved.passages)}
            rows = [where.get((p.id, p.text)) for p in passages]
            if any(i is None for i in rows):
                return None
            source, encoder = saved.keys, None
        else:
            return None
        codec = Float16Codec(source.key_width)
        keys = PrecomputedKeys.from_encoded([source.passage(i) for i in rows], encoder, codec)  # type: ignore[arg-type]
        if encoder is not None:
            return keys, keys_info(encoder, keys)
        return keys, saved.info.model_copy(update={"tokens": keys.num_tokens, "entries": keys.num_entries})

    def attach_saved(self, passages: Sequence[Passage], arrays: dict[str, np.ndarray], info: SavedKeysInfo, where: str) -> None:
        """Serve saved key arrays once an LM binds the store (at once when it has one).

        Args:
            passages: the loaded documents, in the order the keys were saved.
            arrays: the :data:`~nest_integrations.store.shards.KEY_ARRAYS` read from the
                store (memory-mapped), checked here by
                :func:`nest_integrations.index.index_folder.check_key_arrays`.
            info: the manifest's ``keys`` entry; the binding LM is checked against
                it by :func:`check_keys_fit`.
            where: the saved store, for messages.

        Raises:
            ValueError: the store is bound already; arrays of the wrong shape or
                not matching the passages or the manifest's counts; or (when the
                store has an LM) keys another LM encoded.
        """
        from .index_folder import check_key_arrays

        with self._lock:
            if self._datastore is not None:
                raise ValueError(f"this {self.owner} already has a token datastore; saved keys can only be attached before")
            try:
                check_key_arrays(arrays, passages, hidden_size=info.hidden_size, vocab_size=np.iinfo(np.int32).max)
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
            keys = PrecomputedKeys(**arrays)
            if (keys.num_tokens, keys.num_entries) != (info.tokens, info.entries):
                raise ValueError(
                    f"{where}: the manifest counts {info.tokens} tokens and {info.entries} entries of keys; "
                    f"the arrays hold {keys.num_tokens} and {keys.num_entries}"
                )
            self._saved = _SavedKeys(list(passages), keys, info, where)
            if self._lm is not None:
                self._datastore = self._create(self._lm)
