"""alpha/tau of a vector store: fitted for an LM on the store's own documents, kept, saved with the store.

The LangChain and LlamaIndex ``NestVectorStore`` each hold one
:class:`VectorStoreCalibrations` (as they hold one
:class:`~nest_integrations.index.vector_store_keys.VectorStoreKeys`) and know nothing of each
other. It does what both need:

* :class:`StoreCorpus` shows the store to :func:`~nest_integrations.policy.calibration.calibrate`
  as a :class:`~nest_integrations.policy.calibration.CalibrationCorpus`: the
  documents as passages, the store's own similarity search as the first stage
  (leaving a passage out), and decoders over the store's token datastore;
* :meth:`VectorStoreCalibrations.after_add` fits one while documents are added to a
  store given an LM (once it holds :data:`~nest_integrations.policy.calibration.MIN_PASSAGES`
  documents to fit on), so no first question waits for it;
* :meth:`VectorStoreCalibrations.calibration` gives the store's calibration for an
  LM, fitting one the first time (the calibrator a store's decoder runs before
  its first nest generation that leaves alpha or tau to calibration: a store
  that got its LM only from the model); the store only brings its similarity
  search (:data:`Search`);
* calibrations are saved with the store (:class:`CalibrationsFile`): written
  when the store is saved, read when it is loaded (with its other files, so
  from the same version), and a calibration fitted after either is added to
  that file at once, so a reloaded store never fits the same LM again; but
  only while the store saved there is still that version: a store saved or
  loaded before another was saved in its place keeps its fit in memory.

Calibrations are keyed by the LM fingerprint. Documents added or removed later
keep the calibration: alpha/tau follow mostly the model's ratio scale, which a few
documents more or less hardly move (fit again with ``calibrate()``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from nest_integrations.core.config import NestConfig
from nest_integrations.core.folder_snapshot import update_if_current
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.calibration import (
    MIN_PASSAGES, Calibration, CalibrationFile, calibrate, continuation_cuts, retrieve_excluding,
)
from .vector_store_keys import VectorStoreKeys

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.decoding.decoder import NestDecoder
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.store.datastore import TokenDatastore

logger = logging.getLogger(__name__)

Search = Callable[[str, int], list[tuple[Passage, float]]]
"""``(query, k) -> (passage, score)`` pairs: a store's own similarity search, best first."""


@dataclass
class StoreCorpus:
    """A vector store as a :class:`~nest_integrations.policy.calibration.CalibrationCorpus`.

    Attributes:
        lm: the LM keying the store's token datastore.
        passages: the store's documents as passages (a snapshot).
        search: the store's similarity search.
        datastore: the store's token datastore (keys precomputed or encoded on use).
    """

    lm: "LoadedLM"
    passages: Sequence[Passage]
    search: Search
    datastore: "TokenDatastore"

    def retrieve(self, query: str, k: int, *, exclude_ids: Sequence[str] = ()) -> list[tuple[Passage, float]]:
        """Top-k passages for ``query``, skipping ``exclude_ids`` (asks the store for that many more)."""
        return retrieve_excluding(self.search, query, k, exclude_ids)

    def decoder(self, config: Optional[NestConfig] = None) -> "NestDecoder":
        """A decoder over the store's token datastore; calibration gives it its passages itself."""
        from nest_integrations.decoding.decoder import NestDecoder

        return NestDecoder(self.lm, self.datastore, None, config)


@dataclass(frozen=True)
class CalibrationsFile:
    """Where a saved store keeps its calibrations (a :class:`~nest_integrations.policy.calibration.CalibrationFile`
    document), as the store's own file system updates it.

    Attributes:
        where: the file, for messages.
        update: ``update(change)`` replaces the file with ``change(its bytes, or None)`` and
            returns True; False, writing nothing, when the store saved there was replaced
            since (a store holding an old version never writes into the new one).
    """

    where: str
    update: Callable[[Callable[[Optional[bytes]], bytes]], bool]


def local_calibrations_file(path: Path, *, manifest: Path, digest: str, lock: Path) -> CalibrationsFile:
    """The calibrations file at ``path`` on the local disk, of the saved store whose manifest ``manifest``
    has the sha256 ``digest`` (:func:`~nest_integrations.core.folder_snapshot.update_if_current`, under the
    store's save lock on the folder ``lock``)."""
    return CalibrationsFile(str(path), lambda change: update_if_current(path, change, manifest=manifest, digest=digest, lock=lock))


def calibrations_json(calibrations: dict[str, Calibration]) -> bytes:
    """``calibrations`` as the bytes of a calibration file."""
    return CalibrationFile(calibrations=calibrations).to_bytes()


class VectorStoreCalibrations:
    """The calibrations of one vector store by LM fingerprint (see the module docstring).

    Args:
        keys: the store's LM binding, token datastore and documents.
    """

    def __init__(self, keys: VectorStoreKeys):
        self.calibrations: dict[str, Calibration] = {}
        """Calibrations of this store's documents by LM fingerprint."""
        self._keys = keys
        self._file: Optional[CalibrationsFile] = None
        self._fitting = threading.Lock()  # one fit at a time: concurrent calls wait for it and use it
        self._too_short: dict[str, int] = {}  # fingerprint -> document count found too short to fit on

    def saved(self, lm: "LoadedLM") -> Optional[Calibration]:
        """The calibration for ``lm`` this store has (fitted, or read with it); None: none yet."""
        if not self.calibrations:
            return None  # spares fingerprinting the LM (a hash of every weight) for a store never calibrated
        return self.calibrations.get(lm.fingerprint())

    def corpus(self, lm: Optional["LoadedLM"], search: Search) -> StoreCorpus:
        """The store as a calibration corpus for ``lm`` (None: the store's; binds the store to it).

        Raises:
            ValueError: no LM, or one other than the store's.
        """
        datastore = self._keys.datastore(lm)
        return StoreCorpus(datastore.encoder.lm, self._keys.passages(), search, datastore)

    def calibration(self, lm: Optional["LoadedLM"], search: Search, *, show_progress: Optional[bool] = None) -> Optional[Calibration]:
        """The calibration for ``lm`` (None: the store's): the store's, else fitted now (:meth:`calibrate`).

        Returns None, with one warning, when the documents hold no passage of two
        sentences to fit on (the defaults apply; tried again once the store's
        document count changes).

        Args:
            search: the store's similarity search, the fit's first stage.
            show_progress: None: the store's setting.
        """
        lm = self._keys.bind(lm).encoder.lm
        with self._fitting:
            found = self.saved(lm)
            if found is not None:
                return found
            store = self.corpus(lm, search)
            fingerprint = lm.fingerprint()
            if self._too_short.get(fingerprint) == len(store.passages):
                return None
            try:
                return self._fit(store, show_progress=self._progress(show_progress))
            except ValueError as err:
                self._too_short[fingerprint] = len(store.passages)
                logger.warning("%s not calibrated for %s (%s); using the default alpha/tau", self._keys.owner, lm.name, err)
                return None

    def after_add(self, search: Search) -> None:
        """Documents were added: fit alpha/tau for the store's LM now (:meth:`calibrate`, a progress
        bar, at most 90 s) when the store was given one and has no calibration for it yet, so that
        no first generation waits for the fit and a save keeps it. Waits for a store holding
        ``MIN_PASSAGES`` documents of two sentences or more: a fit on fewer would be unsteady
        (until then a first nest generation fits on what there is). Call without the store's lock.

        Args:
            search: the store's similarity search, the fit's first stage.
        """
        lm = self._keys.lm
        if lm is None:
            return
        with self._fitting:
            if self.saved(lm) is not None:
                return
            store = self.corpus(lm, search)
            if len(continuation_cuts(store.passages, MIN_PASSAGES)) < MIN_PASSAGES:
                logger.info("%s: fewer than %d documents to calibrate on yet", self._keys.owner, MIN_PASSAGES)
                return
            self._fit(store, show_progress=self._progress(None))

    def calibrate(
        self,
        lm: Optional["LoadedLM"],
        search: Search,
        *,
        n: int = 12,
        seed: int = 0,
        budget_s: Optional[float] = 90.0,
        show_progress: Optional[bool] = None,
    ) -> Calibration:
        """Fit alpha/tau for ``lm`` (None: the store's) on ``n`` of the store's documents, at most ``budget_s``
        seconds (:func:`~nest_integrations.policy.calibration.calibrate`); keep the result and add it to the saved
        store's file when it has one.

        Raises:
            ValueError: no document of two sentences to fit on; no LM, or one other than the store's.
        """
        corpus = self.corpus(lm, search)
        with self._fitting:
            return self._fit(corpus, n=n, seed=seed, budget_s=budget_s, show_progress=self._progress(show_progress))

    def _progress(self, show_progress: Optional[bool]) -> bool:
        return self._keys.show_progress if show_progress is None else show_progress

    def _fit(self, corpus: StoreCorpus, **options: Any) -> Calibration:
        fitted = calibrate(corpus, **options)
        self.calibrations[fitted.lm_fingerprint] = fitted
        if self._file is not None:
            self._add_to_file(self._file, fitted)
        return fitted

    @staticmethod
    def _add_to_file(file: CalibrationsFile, fitted: Calibration) -> None:
        """Add ``fitted`` to the calibrations in ``file`` (others, e.g. from another process, stay)."""

        def added(raw: Optional[bytes]) -> bytes:
            saved = dict(CalibrationFile.parse(raw, file.where).calibrations)
            saved[fitted.lm_fingerprint] = fitted
            return calibrations_json(saved)

        try:
            written = file.update(added)
        except (OSError, ValueError) as err:  # the store folder moved or is read-only, the file is a folder...
            logger.warning("cannot save the calibration of %s to %s (%s); it is kept in memory", fitted.lm_name, file.where, err)
            return
        if not written:
            logger.warning(
                "the store saved at %s was replaced since this one was saved or loaded; the calibration of %s is kept "
                "in memory, not written into the other store", file.where, fitted.lm_name,
            )

    # ------------------------------------------------------------------ persistence
    def to_save(self) -> Optional[bytes]:
        """The calibrations as a file's bytes, for the store's save; None when there are none."""
        return calibrations_json(self.calibrations) if self.calibrations else None

    def saved_to(self, file: CalibrationsFile) -> None:
        """The store was saved with :meth:`to_save`'s bytes in ``file``: later fits go there too."""
        self._file = file

    def load(self, file: CalibrationsFile, raw: Optional[bytes]) -> None:
        """Take the calibrations the loaded store had in ``file`` (its bytes ``raw``, None: no file,
        read with the store's other files); later fits go there too."""
        self.calibrations = dict(CalibrationFile.parse(raw, file.where).calibrations)
        self._file = file
