"""NestIndex: a corpus, its passage retriever and its token datastore, saved as one folder.

The folder (layout, manifest, reading and checking it: :mod:`nest_integrations.index.index_folder`)
holds no pickle, and loading never executes code from it. Saving never replaces a folder that is
not an index (nor an index without ``overwrite=True``) and switches the new folder in atomically;
loading checks every file against the manifest. See :mod:`nest_integrations.core.safe_io`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from nest_integrations.core.folder_snapshot import FolderSnapshot, read_consistently, update_if_current
from nest_integrations.core.safe_io import MANIFEST_FILE, atomic_folder, recover, sha256_file
from nest_integrations.core.similarity import cosine_similarities
from nest_integrations.corpus.passages import Passage, save_passages_jsonl
from nest_integrations.model.key_reader import parse_key_layer
from nest_integrations.policy.calibration import CALIBRATION_FILE, Calibration, CalibrationFile, retrieve_excluding
from nest_integrations.policy.mentions import CorpusTerms
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder
from nest_integrations.store.codec_base import DEFAULT_TRAIN_KEYS, KeyCodec
from nest_integrations.store.key_codec import resolve_codec
from nest_integrations.store.shards import KEY_ARRAYS, ShardedKeys
from .index_folder import FORMAT, read_index_folder, saved_keys

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.core.config import NestConfig
    from nest_integrations.decoding.decoder import NestDecoder
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.retrieval import DenseRetriever

logger = logging.getLogger(__name__)


class NestIndex:
    """Everything NEST needs over one corpus.

    Attributes:
        lm: the LM whose hidden states are the keys.
        passages: the corpus.
        dense: dense retriever (FAISS + sentence embeddings); the relevance gate
            uses its embedder.
        retriever: the first stage (hybrid dense + BM25 by default).
        datastore: the token-level datastore (lazy, or precomputed).
    """

    def __init__(
        self,
        lm: "LoadedLM",
        passages: Sequence[Passage],
        dense: "DenseRetriever",
        *,
        retriever_kind: str = "hybrid",
        key_layer: str = "ffn_input",
        encoding_prefix: Optional[str] = "auto",
        cache_mb: float = 1024.0,
    ):
        from nest_integrations.retrieval import BM25Retriever, HybridRetriever

        if not passages:
            raise ValueError("cannot build a NEST index over an empty corpus")
        _check_retriever(retriever_kind)
        self.lm = lm
        self.passages = list(passages)
        self.dense = dense
        self.retriever_kind = retriever_kind
        if retriever_kind == "dense":
            self.retriever: Any = dense
        else:
            sparse = BM25Retriever(self.passages)
            self.retriever = sparse if retriever_kind == "bm25" else HybridRetriever(dense, sparse)
        self.encoding_prefix = encoding_prefix
        self.precompute_rate: Optional[float] = None
        """Tokens per second of the last key precomputation (None when keys are lazy)."""
        self._vector_cache: dict[str, np.ndarray] = {}
        self._passage_of_text: Optional[dict[str, Passage]] = None
        self.folder: Optional[Path] = None
        """Where the index was saved or loaded from (calibrations are written there); None in memory."""
        self.identity: Optional[str] = None
        """The sha256 of the manifest of the version saved or loaded (:func:`index_identity`); None in memory.
        A calibration is written into :attr:`folder` only while it still holds this version."""
        self.calibrations: dict[str, Calibration] = {}
        """Calibrations of this corpus by LM fingerprint (:mod:`~nest_integrations.policy.calibration`)."""
        self.datastore = TokenDatastore(self.passages, PassageEncoder(lm, key_layer, encoding_prefix), cache_mb=cache_mb)

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        lm: "LoadedLM",
        *,
        embedder: Any = None,
        index_factory: str = "auto",
        faiss_options: Optional[dict[str, Any]] = None,
        retriever_kind: str = "hybrid",
        key_layer: str = "ffn_input",
        encoding_prefix: Optional[str] = "auto",
        precompute_keys: bool = False,
        show_progress: bool = True,
        cache_mb: float = 1024.0,
        key_codec: KeyCodec | str = "float16",
        codec_train_keys: int = DEFAULT_TRAIN_KEYS,
        calibrate: bool = True,
    ) -> "NestIndex":
        """Embed the corpus for the passage stage, optionally encode all token keys now, and fit
        alpha/tau for ``lm`` on the corpus.

        Args:
            calibrate: fit the calibration now (:meth:`calibration`: a progress bar, at most
                90 s; the default LM takes about a minute on 2 CPU cores), so that :meth:`save`
                keeps it and no first generation waits for it. False leaves it to the first nest
                or ra_nest generation (or ``nest calibrate``). A corpus with no passage of two
                sentences is not calibrated (the defaults apply).
            key_codec: how precomputed keys are stored (``precompute_keys`` only):
                ``"float16"`` (1,152 B/token on the default LM), ``"pq144"``,
                ``"opq96"``, ``"sq8"``... (:mod:`nest_integrations.store.key_codec`);
                trained on ``codec_train_keys`` keys of the first passages.
            index_factory: the dense first stage's FAISS index: "auto" (flat
                below 100k passages, IVF above), "flat", "ivf", "hnsw" or a
                FAISS factory string (see :mod:`nest_integrations.retrieval.faiss_index`).
            faiss_options: more :class:`~nest_integrations.retrieval.DenseRetriever`
                index knobs: ``nlist``, ``nprobe``, ``hnsw_m``, ``ef_search``, ``on_disk``.
        """
        from nest_integrations.retrieval import DenseRetriever

        if not passages:
            raise ValueError("cannot build a NEST index over an empty corpus")
        options = dict(faiss_options or {})
        check_build_options(
            len(passages), lm, index_factory=index_factory, faiss_options=options, retriever_kind=retriever_kind,
            key_layer=key_layer, key_codec=key_codec if precompute_keys else None,
        )
        dense = DenseRetriever(passages, embedder, index_factory=index_factory, show_progress=show_progress, **options)
        index = cls(
            lm, passages, dense, retriever_kind=retriever_kind, key_layer=key_layer,
            encoding_prefix=encoding_prefix, cache_mb=cache_mb,
        )
        if precompute_keys:
            index.precompute_rate = index.datastore.precompute(
                show_progress=show_progress, codec=key_codec, train_keys=codec_train_keys
            )
        elif key_codec not in ("float16", "none"):
            raise ValueError("key_codec applies to precomputed keys; pass precompute_keys=True")
        if calibrate:
            try:
                index.calibrate(show_progress=show_progress)
            except ValueError as err:  # said once more, as a warning, if a generation needs it
                logger.info("not calibrated while building (%s)", err)
        return index

    # ------------------------------------------------------------------ use
    def relevance(self, query: str, texts: Sequence[str]) -> list[float]:
        """Cosine similarity of each text to ``query`` under the dense embedder
        (a :data:`~nest_integrations.core.similarity.Relevance`, the decoder's relevance gate and answer windows).

        A text that an indexed passage holds has that passage's vector, the one
        it was retrieved by (its ``"title: text"`` embedding, read back from a
        flat index, else embedded: :meth:`DenseRetriever.passage_vectors`); any
        other text (an answer window) is embedded as it is. Both the query and
        the vectors are the retriever's unit vectors, so each cosine is their
        float32 dot product. Vectors are cached by text: the gate runs on every
        generation, and re-embedding its passages each time would cost a
        forward of the embedder per generation.
        """
        if not texts:
            return []
        q = self.dense.embed_queries([query])[0]
        return cosine_similarities(q, self._text_vectors(texts), normalised=True)

    def _text_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (n, d) L2-normalised embeddings of ``texts`` (as :meth:`relevance` says), cached by text."""
        missing = [text for text in dict.fromkeys(texts) if text not in self._vector_cache]
        if missing:
            if self._passage_of_text is None:  # built whole before it is shared: the gate runs in many threads
                # The first of two passages with the same text stands for both (their vectors differ if their titles do).
                held: dict[str, Passage] = {}
                for passage in self.dense.passages:
                    held.setdefault(passage.text, passage)
                self._passage_of_text = held
            # A text no passage holds goes in as an untitled passage the index has not got: embedded as it is.
            passages = [self._passage_of_text.get(text) or Passage(id="\x00text", text=text) for text in missing]
            self._vector_cache.update(zip(missing, self.dense.passage_vectors(passages)))
        return np.stack([self._vector_cache[text] for text in texts])

    def retrieve(self, query: str, k: int, *, exclude_ids: Sequence[str] = ()) -> list[tuple[Passage, float]]:
        """Top-k passages for ``query``, skipping ``exclude_ids`` (for source-absent evaluation)."""
        return retrieve_excluding(self.retriever.retrieve, query, k, exclude_ids)

    def decoder(self, config: Optional["NestConfig"] = None, *, datastore: Optional[TokenDatastore] = None) -> "NestDecoder":
        """A :class:`NestDecoder` over this index (retrieval, relevance gate, datastore).

        Where the config leaves alpha or tau to calibration (the default), the
        decoder uses this index's calibration for its LM; when there is none, its
        first nest or ra_nest generation fits one (:meth:`calibration`).
        ``datastore``: the token datastore it copies from, over this index's passages (default:
        the index's own; an evaluation gives each generation a fresh lazy one, cold keys).
        """
        from nest_integrations.decoding.decoder import NestDecoder

        return NestDecoder(
            self.lm, self.datastore if datastore is None else datastore, self.retriever, config, relevance=self.relevance,
            # No calibrations yet: no need to fingerprint the LM (hashes every weight, once per model) to look one up.
            calibration=self.calibrations.get(self.lm.fingerprint()) if self.calibrations else None,
            calibrator=self.calibration, corpus_terms=self.corpus_terms,
        )

    @functools.cached_property
    def corpus_terms(self) -> CorpusTerms:
        """The folded words of every passage and its title (:class:`~nest_integrations.policy.mentions.CorpusTerms`),
        read once: a question naming something none of them holds is not covered (a question "with
        pathlib" over a document titled ``pathlib`` is)."""
        return CorpusTerms(f"{p.title}\n{p.text}" for p in self.passages)

    def calibration(self, *, show_progress: bool = True) -> Optional[Calibration]:
        """alpha/tau for this index's LM on its corpus: the saved one, else fitted now (and saved).

        The first call for an LM without one runs :meth:`calibrate` (a progress
        bar; at most ``budget_s``, 90 s by default). Returns None, with a
        warning, for a corpus too short to calibrate on (the defaults apply).
        """
        found = self.calibrations.get(self.lm.fingerprint())
        if found is not None:
            return found
        try:
            return self.calibrate(show_progress=show_progress)
        except ValueError as err:
            logger.warning("not calibrated (%s); using the default alpha/tau", err)
            return None

    def calibrate(self, *, n: int = 12, seed: int = 0, budget_s: Optional[float] = 90.0, show_progress: bool = True) -> Calibration:
        """Fit alpha/tau for this index's LM on ``n`` of its passages (:func:`~nest_integrations.policy.calibration.calibrate`),
        keep the result, and add it to the saved folder's calibrations when the index has one."""
        from nest_integrations.policy.calibration import calibrate

        fitted = calibrate(self, n=n, seed=seed, budget_s=budget_s, show_progress=show_progress)
        self.calibrations[fitted.lm_fingerprint] = fitted
        if self.folder is not None and self.identity is not None:
            self._save_calibration(self.folder, self.identity, fitted)
        return fitted

    @staticmethod
    def _save_calibration(folder: Path, identity: str, fitted: Calibration) -> None:
        """Add ``fitted`` to ``folder``'s calibrations (others, e.g. another process's, stay) while the folder
        holds the version ``identity``: an index rebuilt or replaced since gets nothing of this one's."""
        where = folder / CALIBRATION_FILE

        def added(raw: Optional[bytes]) -> bytes:
            saved = CalibrationFile.parse(raw, str(where))
            saved.calibrations[fitted.lm_fingerprint] = fitted
            return saved.to_bytes()

        try:
            written = update_if_current(where, added, manifest=folder / MANIFEST_FILE, digest=identity, lock=Path(os.path.abspath(folder)).parent)
        except (OSError, ValueError) as err:  # a read-only folder, a calibration.json that is not a file
            logger.warning("cannot save the calibration of %s to %s (%s); it is kept in memory", fitted.lm_name, where, err)
            return
        if not written:
            logger.warning(
                "%s was rebuilt or replaced since this index was loaded; the calibration of %s is kept in memory, "
                "not written into the other index", folder, fitted.lm_name,
            )

    def info(self) -> dict[str, Any]:
        pre = self.datastore.precomputed
        return {
            "passages": len(self.passages),
            "lm": self.lm.name,
            "key_layer": self.datastore.encoder.key_layer,
            "encoding_prefix": self.datastore.encoder.prefix_text,
            "hidden_size": self.datastore.hidden_size,
            "retriever": self.retriever_kind,
            "embedder": self.dense.embedder_name,
            "index_factory": self.dense.index_factory,
            "faiss_memory_mapped": self.dense.memory_mapped,
            "precomputed_keys": pre is not None,
            "tokens": pre.num_tokens if pre is not None else None,
            "datastore_entries": pre.num_entries if pre is not None else None,
            "key_bytes": pre.key_bytes if pre is not None else None,
            "key_shards": len(pre.segments) if isinstance(pre, ShardedKeys) else None,
            "key_codec": self.datastore.codec.spec,
            "key_bytes_per_token": self.datastore.codec.bytes_per_key,
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the index folder atomically (see :mod:`nest_integrations.core.safe_io`).

        Args:
            overwrite: replace an index already saved at ``path``. Without it an
                existing index is refused too: rebuilding one can take hours.

        Raises:
            ValueError: ``path`` is a non-empty folder that is not a NEST index
                (never replaced), or an index and ``overwrite`` is False.
        """
        target = Path(path)
        with atomic_folder(target, kind=FORMAT, overwrite=overwrite) as tmp:
            self.write_into(tmp)
            if self.calibrations:
                CalibrationFile(calibrations=self.calibrations).write(tmp)
            identity = sha256_file(tmp / MANIFEST_FILE)
        self.folder, self.identity = target, identity
        return target

    def write_into(self, folder: Path) -> None:
        """Write every file of the index and its manifest into the new, empty ``folder``.

        Sharded keys already in ``folder/keys`` (a distributed build writes them
        there first) are kept as they are; sharded keys elsewhere are copied.
        Use :meth:`save` unless ``folder`` is the temporary of an
        :func:`~nest_integrations.core.safe_io.atomic_folder`.
        """
        encoder = self.datastore.encoder
        pre = self.datastore.precomputed
        codec = pre.codec if pre is not None else None
        compressed = codec is not None and codec.compresses
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": 2 if isinstance(pre, ShardedKeys) or compressed else 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "lm": {"name": self.lm.name, "fingerprint": self.lm.fingerprint()},
            "tokenizer_fingerprint": self.lm.tokenizer_fingerprint(),
            "key_layer": encoder.key_layer,
            "encoding_prefix": self.encoding_prefix,
            "encoding_prefix_text": encoder.prefix_text,
            "max_passage_tokens": encoder.max_passage_tokens,
            "hidden_size": self.datastore.hidden_size,
            "dtype": "float16",
            "retriever": self.retriever_kind,
            "counts": {
                "passages": len(self.passages),
                "tokens": pre.num_tokens if pre is not None else 0,
                "entries": pre.num_entries if pre is not None else 0,
            },
            "precomputed_keys": pre is not None,
        }
        if compressed:
            manifest["key_codec"] = codec.spec
        save_passages_jsonl(self.passages, folder / "passages.jsonl")
        self.dense.save(folder)
        if isinstance(pre, ShardedKeys):
            (folder / "keys").mkdir(exist_ok=True)
            manifest["key_shards"] = [vars(r) for r in pre.copy_to(folder / "keys")]
        elif pre is not None:
            (folder / "keys").mkdir()
            for name in KEY_ARRAYS:
                np.save(folder / "keys" / f"{name}.npy", np.ascontiguousarray(getattr(pre, name)), allow_pickle=False)
        if compressed:  # one codec for the flat arrays or for every shard
            (folder / "keys" / "codec").mkdir()
            for name, array in codec.arrays().items():
                np.save(folder / "keys" / "codec" / f"{name}.npy", array, allow_pickle=False)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        manifest["checksums"] = {p.relative_to(folder).as_posix(): sha256_file(p) for p in files}
        (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        lm: Optional["LoadedLM"] = None,
        *,
        verify_checksums: bool = True,
        embedder: Any = None,
        trust_paths: bool = False,
        cache_mb: float = 1024.0,
    ) -> "NestIndex":
        """Load an index folder, trusting nothing in it.

        Every file read must be listed in the manifest with its sha256 and lie
        inside the folder; the manifest is validated field by field; the keys
        must agree with the passages, the offsets and the LM.

        Args:
            lm: the LM to decode with. None loads the bundled default LM when the
                index names it; an index naming another model (a path or hub id
                written in the folder) needs ``lm=`` or ``trust_paths=True``.
                An LM whose weights differ from those that built the keys is
                refused (see :func:`nest_integrations.model.lm.fingerprints_match`).
            verify_checksums: hash every file against the manifest (reads every
                byte; docs/persistence.md); False still requires every file to be listed.
            embedder: the passage embedder; None uses the bundled MiniLM when the
                index names it (else as for ``lm``).
            trust_paths: load a model or embedder named in the folder.
            cache_mb: bound of the lazy key cache.

        Raises:
            ValueError: a missing, unlisted or corrupted file, an invalid or
                newer manifest, inconsistent keys, another LM or tokenizer, or an
                untrusted model path.
        """
        from nest_integrations.model.lm import embedded_model, fingerprints_match, load_lm
        from nest_integrations.retrieval import DenseRetriever

        folder = Path(path)
        recover(folder)
        saved = read_consistently(
            lambda: FolderSnapshot(folder, what="NEST index"), lambda snapshot: read_index_folder(snapshot, verify_checksums=verify_checksums),
            where=str(folder),
        )
        manifest = saved.manifest
        if lm is None:
            if embedded_model(manifest.lm.name) is None and not trust_paths:
                raise ValueError(
                    f"{folder} names the LM {manifest.lm.name!r}; pass lm=load_lm(...) (CLI: --model) "
                    "or trust_paths=True to load a model named in a saved folder"
                )
            lm = load_lm(manifest.lm.name)
        if not fingerprints_match(manifest.lm.fingerprint, lm.fingerprint()):
            raise ValueError(
                f"{folder} was built with LM {manifest.lm.name!r} (fingerprint {manifest.lm.fingerprint}); "
                f"the given LM {lm.name!r} has fingerprint {lm.fingerprint()}. Its keys would not match this LM's "
                "hidden states: rebuild the index with this LM (or load the LM in float32)."
            )
        if lm.tokenizer_fingerprint() != manifest.tokenizer_fingerprint:
            raise ValueError(f"{folder} was built with another tokenizer than {lm.name!r}'s")
        passages = saved.passages
        dense = DenseRetriever.from_saved(saved.dense, passages, embedder=embedder, show_progress=False, trust_paths=trust_paths)
        index = cls(
            lm,
            passages,
            dense,
            retriever_kind=manifest.retriever,
            key_layer=manifest.key_layer,
            encoding_prefix=manifest.encoding_prefix_text,
            cache_mb=cache_mb,
        )
        if manifest.hidden_size != index.datastore.hidden_size:
            raise ValueError(f"{folder}: keys are {manifest.hidden_size}-d, the LM's hidden size is {index.datastore.hidden_size}")
        if manifest.precomputed_keys:
            index.datastore.attach_precomputed(saved_keys(folder, saved, vocab_size=len(lm.tokenizer)))
        index.folder = folder
        index.identity = saved.identity
        index.calibrations = dict(CalibrationFile.parse(saved.calibration, str(folder / CALIBRATION_FILE)).calibrations)
        return index



def _check_retriever(kind: str) -> None:
    if kind not in ("hybrid", "dense", "bm25"):
        raise ValueError(f"retriever_kind must be hybrid, dense or bm25, got {kind!r}")


def check_build_options(
    passages: int,
    lm: "LoadedLM",
    *,
    index_factory: str = "auto",
    faiss_options: Optional[dict[str, Any]] = None,
    retriever_kind: str = "hybrid",
    key_layer: str = "ffn_input",
    key_codec: "KeyCodec | str | None" = None,
) -> None:
    """Refuse build settings that cannot work, before any passage is embedded or encoded.

    A wrong ``nlist`` or key codec used to surface only once the whole corpus
    was embedded (minutes to hours); every check here costs microseconds.

    Args:
        passages: how many passages the index will hold.
        lm: the LM whose hidden size the key codec must fit.
        faiss_options: ``nlist``, ``nprobe``, ``hnsw_m``, ``ef_search``, ``on_disk``
            (:class:`~nest_integrations.retrieval.faiss_index.IndexSpec`).
        key_codec: the precomputed keys' codec, None when keys are lazy.

    Raises:
        ValueError: an unknown FAISS option, retriever or key layer; ``nlist``
            above ``passages`` or another knob out of range; a codec that does
            not fit the LM's hidden size (e.g. ``pq7`` for 576 dimensions,
            ``spq1``). The message names the setting.
    """
    from nest_integrations.retrieval.faiss_index import IndexSpec

    options = dict(faiss_options or {})
    unknown = sorted(set(options) - {"nlist", "nprobe", "hnsw_m", "ef_search", "on_disk"})
    if unknown:
        raise ValueError(f"unknown faiss_options {unknown}; accepted: nlist, nprobe, hnsw_m, ef_search, on_disk")
    IndexSpec(index_factory, **{k: v for k, v in options.items() if v is not None}).factory_for(passages)
    _check_retriever(retriever_kind)
    parse_key_layer(key_layer)
    if key_codec is not None:
        try:
            resolve_codec(key_codec, lm.hidden_size)
        except ValueError as err:
            raise ValueError(f"key_codec {getattr(key_codec, 'spec', key_codec)!r} (CLI: --key-compression): {err}") from None


def index_identity(path: str | os.PathLike[str]) -> str:
    """The identity of one build of an index: the sha256 of its ``manifest.json``.

    The manifest lists the sha256 of every file, the LM's fingerprint and the
    build time, so two folders share an identity only when one is a copy of the
    other; a rebuild of the same corpus gets a new one. Resumable jobs record it
    (:func:`nest_integrations.index.jobs.job_settings`) so that outputs of two indexes never mix.

    Raises:
        ValueError: ``path`` holds no manifest.
    """
    manifest = Path(path) / MANIFEST_FILE
    if not manifest.is_file():
        raise ValueError(f"{path} is not a NEST index (no {MANIFEST_FILE})")
    return sha256_file(manifest)
