"""NestIndex: a corpus, its passage retriever and its token datastore, saved as one folder.

Folder layout (no pickle anywhere; loading never executes code from the folder)::

    manifest.json      format version, LM and tokenizer fingerprints, key layer,
                       encoding prefix, hidden size, dtype, counts, sha256 of every file
    passages.jsonl     one Passage per line
    dense.faiss        FAISS index of passage embeddings   (+ dense.json)
    keys/*.npy         precomputed token keys (optional), memory-mapped on load

Writes go to a temporary sibling folder that is renamed into place, so a
crash never leaves a half-written index behind.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from .corpus import Passage, load_passages_jsonl, save_passages_jsonl
from .datastore import PassageEncoder, PrecomputedKeys, TokenDatastore
from .safe_io import atomic_folder, sha256_file

if TYPE_CHECKING:  # pragma: no cover
    from .config import NestConfig
    from .decoding import NestDecoder
    from .lm import LoadedLM
    from .retrieval import DenseRetriever

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_KEY_ARRAYS = ("token_ids", "char_spans", "keys", "valid", "offsets")


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
        from .retrieval import BM25Retriever, HybridRetriever

        if not passages:
            raise ValueError("cannot build a NEST index over an empty corpus")
        if retriever_kind not in ("hybrid", "dense", "bm25"):
            raise ValueError(f"retriever_kind must be hybrid, dense or bm25, got {retriever_kind!r}")
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
        self._vector_cache: dict[tuple[str, str], np.ndarray] = {}
        self.datastore = TokenDatastore(self.passages, PassageEncoder(lm, key_layer, encoding_prefix), cache_mb=cache_mb)

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        lm: "LoadedLM",
        *,
        embedder: Any = None,
        index_factory: str = "Flat",
        retriever_kind: str = "hybrid",
        key_layer: str = "ffn_input",
        encoding_prefix: Optional[str] = "auto",
        precompute_keys: bool = False,
        show_progress: bool = True,
    ) -> "NestIndex":
        """Embed the corpus for the passage stage and, optionally, encode all token keys now."""
        from .retrieval import DenseRetriever

        if not passages:
            raise ValueError("cannot build a NEST index over an empty corpus")
        dense = DenseRetriever(passages, embedder, index_factory=index_factory, show_progress=show_progress)
        index = cls(lm, passages, dense, retriever_kind=retriever_kind, key_layer=key_layer, encoding_prefix=encoding_prefix)
        if precompute_keys:
            index.precompute_rate = index.datastore.precompute(show_progress=show_progress)
        return index

    # ------------------------------------------------------------------ use
    def relevance(self, query: str, passages: Sequence[Passage]) -> list[float]:
        """Cosine similarity of each passage to ``query`` under the dense embedder.

        Passage vectors come from :meth:`DenseRetriever.passage_vectors` (read
        back from a flat index, else embedded) and are cached: the gate runs on
        every generation, and re-embedding 8 passages costs ~0.5 s on 2 cores.
        """
        if not passages:
            return []
        q = self.dense.embed_queries([query])[0]
        return [float(v) for v in self._passage_vectors(passages) @ q]

    def _passage_vectors(self, passages: Sequence[Passage]) -> np.ndarray:
        """float32 (n, d) L2-normalised embeddings of ``passages``, cached by (id, text)."""
        missing = list({(p.id, p.text): p for p in passages if (p.id, p.text) not in self._vector_cache}.values())
        if missing:
            vectors = self.dense.passage_vectors(missing)
            self._vector_cache.update({(p.id, p.text): v for p, v in zip(missing, vectors)})
        return np.stack([self._vector_cache[(p.id, p.text)] for p in passages])

    def retrieve(self, query: str, k: int, *, exclude_ids: Sequence[str] = ()) -> list[tuple[Passage, float]]:
        """Top-k passages for ``query``, skipping ``exclude_ids`` (for source-absent evaluation)."""
        excluded = set(exclude_ids)
        hits = self.retriever.retrieve(query, k + len(excluded))
        return [(p, s) for p, s in hits if p.id not in excluded][:k]

    def decoder(self, config: Optional["NestConfig"] = None) -> "NestDecoder":
        """A :class:`NestDecoder` over this index (retrieval, relevance gate, datastore)."""
        from .decoding import NestDecoder

        return NestDecoder(self.lm, self.datastore, self.retriever, config, relevance=self.relevance)

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
            "precomputed_keys": pre is not None,
            "tokens": int(len(pre.token_ids)) if pre is not None else None,
            "datastore_entries": int(pre.valid.sum()) if pre is not None else None,
            "key_bytes": int(pre.keys.nbytes) if pre is not None else None,
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the index folder atomically (temporary folder, then rename)."""
        target = Path(path)
        with atomic_folder(target) as tmp:
            save_passages_jsonl(self.passages, tmp / "passages.jsonl")
            self.dense.save(tmp)
            pre = self.datastore.precomputed
            if pre is not None:
                (tmp / "keys").mkdir()
                for name in _KEY_ARRAYS:
                    np.save(tmp / "keys" / f"{name}.npy", np.ascontiguousarray(getattr(pre, name)), allow_pickle=False)
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            encoder = self.datastore.encoder
            manifest = {
                "format_version": FORMAT_VERSION,
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
                    "tokens": int(len(pre.token_ids)) if pre is not None else 0,
                    "entries": int(pre.valid.sum()) if pre is not None else 0,
                },
                "precomputed_keys": pre is not None,
                "checksums": {str(p.relative_to(tmp)): sha256_file(p) for p in files},
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
        return target

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        lm: Optional["LoadedLM"] = None,
        *,
        verify_checksums: bool = True,
        embedder: Any = None,
    ) -> "NestIndex":
        """Load an index folder.

        Args:
            lm: the LM to decode with; None loads the one named in the manifest.
                An LM whose fingerprint differs from the one that built the keys
                is refused: its hidden states would be silently meaningless.
            verify_checksums: hash every file against the manifest (seconds per GB).

        Raises:
            ValueError: missing or corrupted files, a newer format, another LM
                or tokenizer.
        """
        from .lm import load_lm
        from .retrieval import DenseRetriever

        folder = Path(path)
        manifest_path = folder / "manifest.json"
        if not manifest_path.is_file():
            raise ValueError(f"{folder} is not a NEST index (no manifest.json)")
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{manifest_path} is not valid JSON: {err}") from err
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ValueError(
                f"{folder} has index format {version!r}; this nest-integrations reads format <= {FORMAT_VERSION}. "
                "Upgrade the package or rebuild the index."
            )
        if verify_checksums:
            for rel, expected in manifest["checksums"].items():
                file = folder / rel
                if not file.is_file():
                    raise ValueError(f"{folder} is incomplete: {rel} is missing")
                if sha256_file(file) != expected:
                    raise ValueError(f"{folder} is corrupted: {rel} does not match its checksum")
        if lm is None:
            lm = load_lm(manifest["lm"]["name"])
        if lm.fingerprint() != manifest["lm"]["fingerprint"]:
            raise ValueError(
                f"{folder} was built with LM {manifest['lm']['name']!r} (fingerprint {manifest['lm']['fingerprint']}); "
                f"the given LM {lm.name!r} has fingerprint {lm.fingerprint()}. Its keys would not match this LM's "
                "hidden states: rebuild the index with this LM."
            )
        if lm.tokenizer_fingerprint() != manifest["tokenizer_fingerprint"]:
            raise ValueError(f"{folder} was built with another tokenizer than {lm.name!r}'s")
        passages = load_passages_jsonl(folder / "passages.jsonl")
        if len(passages) != manifest["counts"]["passages"]:
            raise ValueError(f"{folder}: manifest says {manifest['counts']['passages']} passages, found {len(passages)}")
        dense = DenseRetriever.load(folder, passages, embedder=embedder, show_progress=False)
        index = cls(
            lm,
            passages,
            dense,
            retriever_kind=manifest["retriever"],
            key_layer=manifest["key_layer"],
            encoding_prefix=manifest["encoding_prefix_text"],
        )
        if manifest["hidden_size"] != index.datastore.hidden_size:
            raise ValueError(f"{folder}: keys are {manifest['hidden_size']}-d, the LM's hidden size is {index.datastore.hidden_size}")
        if manifest.get("precomputed_keys"):
            arrays = {name: np.load(folder / "keys" / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in _KEY_ARRAYS}
            try:
                index.datastore.attach_precomputed(PrecomputedKeys(**arrays))
            except AssertionError as err:
                raise ValueError(f"{folder}: key arrays have the wrong dtype or shape") from err
        return index
