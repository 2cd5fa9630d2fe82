"""The token-level datastore: LM hidden states of corpus tokens, searched by the decoder.

Each passage's entries (keys, values, sources) come from the
:class:`~nest_integrations.store.encoder.PassageEncoder`. Two storage modes give
identical neighbours:

* lazy (default): passages are encoded the first time they are retrieved and
  kept in an LRU cache bounded in megabytes;
* precomputed: :meth:`TokenDatastore.precompute` encodes the whole corpus once;
  saved datastores memory-map the arrays
  (:mod:`~nest_integrations.store.key_sources`).

Keys are stored as the datastore's :mod:`key codec <nest_integrations.store.key_codec>`
writes them: float16 rows by default, or FAISS codes (``pq<M>``, ``opq<M>``,
``spq<M>``, ``sq8``) in either mode.

Search is vectorised over a :class:`~nest_integrations.store.candidates.CandidateSet`
(:meth:`TokenDatastore.candidates`: the entries of the passages retrieved for one
generation), built once per generation.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from nest_integrations.corpus.passages import Passage

from .candidates import CandidateSet
from .encoder import EncodedPassage, PassageEncoder
from .codec_base import DEFAULT_TRAIN_KEYS, Float16Codec, KeyCodec, sample_rows
from .key_codec import resolve_codec
from .key_sources import KeySource, PrecomputedKeys

logger = logging.getLogger(__name__)


@dataclass
class EncodeStats:
    """What fetching passages cost: forward batches run, passages encoded, seconds."""

    encode_passes: int = 0
    encoded_passages: int = 0
    encode_s: float = 0.0


class TokenDatastore:
    """Keys, values and sources for every token of a passage collection.

    Args:
        passages: the corpus; entries refer to passages by index in this list.
        encoder: the :class:`PassageEncoder` (LM, key layer, prefix).
        cache_mb: bound of the lazy LRU cache in megabytes (keys dominate:
            ``codec.bytes_per_key`` per token, 1,152 B for float16 on SmolLM2).
        codec: how keys are stored and scored (:mod:`nest_integrations.store.key_codec`);
            None: float16. A compressing codec must be trained (or trained by
            :meth:`precompute` / :meth:`train_codec`) before passages are fetched.

    Thread-safe: concurrent generations may fetch passages at the same time.
    """

    def __init__(
        self, passages: Sequence[Passage], encoder: PassageEncoder, *, cache_mb: float = 1024.0,
        codec: KeyCodec | None = None,
    ):
        if cache_mb <= 0:
            raise ValueError("cache_mb must be positive")
        self.encoder = encoder
        self.codec: KeyCodec = codec if codec is not None else Float16Codec(encoder.lm.hidden_size)
        if self.codec.dim != encoder.lm.hidden_size:
            raise ValueError(f"the key codec is {self.codec.dim}-d, the LM's hidden size is {encoder.lm.hidden_size}")
        self.cache_bytes = int(cache_mb * 2**20)
        self._cache: OrderedDict[int, EncodedPassage] = OrderedDict()
        self._cached_bytes = 0
        self._precomputed: KeySource | None = None
        self._lock = threading.RLock()
        self.passages: list[Passage] = []
        self._index_by_id: dict[str, int] = {}
        self._chunks_by_document: dict[str, list[tuple[int, int]]] | None = None  # built on first use
        for passage in passages:
            self.add(passage)

    def add(self, passage: Passage) -> int:
        """Index of ``passage`` in the datastore, adding it when its id is new.

        A known id whose text changed gets a fresh index, so stale keys are
        never served for new text. Passages from any retriever (a LangChain or
        LlamaIndex one) enter the datastore this way and are encoded lazily.
        """
        with self._lock:
            index = self._index_by_id.get(passage.id)
            if index is not None and self.passages[index].text == passage.text:
                self.passages[index] = passage  # keys depend on the text only; keep the newest title/metadata
                return index
            self.passages.append(passage)
            self._index_by_id[passage.id] = len(self.passages) - 1
            self._chunks_by_document = None
            return len(self.passages) - 1

    def remove(self, passage_ids: Iterable[str]) -> int:
        """Forget passages by id; unknown ids are ignored. Returns how many were removed.

        Indices are never reused: a removed passage's slot stays (so generations
        already running over it finish undisturbed, and every other passage keeps
        its cached or precomputed keys), but its id no longer resolves and its
        lazily cached keys are freed. Adding the id again gives a fresh index.
        Precomputed rows of removed passages stay in the arrays.
        """
        removed = 0
        with self._lock:
            for passage_id in passage_ids:
                index = self._index_by_id.pop(passage_id, None)
                if index is None:
                    continue
                removed += 1
                self._chunks_by_document = None
                encoded = self._cache.pop(index, None)
                if encoded is not None:
                    self._cached_bytes -= encoded.nbytes
        return removed

    def live_passages(self) -> list[Passage]:
        """The passages their ids resolve to, in index order (removed passages and
        replaced versions left out)."""
        with self._lock:
            return [self.passages[i] for i in sorted(self._index_by_id.values())]

    def index_of(self, passage_id: str) -> int | None:
        return self._index_by_id.get(passage_id)

    def following_chunk(self, index: int) -> int | None:
        """Index of the passage that goes on from passage ``index`` in its document: the live
        chunk of the same ``doc_id`` that starts next after it, when it continues it
        (:meth:`~nest_integrations.corpus.passages.Passage.continued_by`: after the white space
        cut at its end, or inside it where splitters overlap their chunks); None at the
        document's end and for a passage without a document. The same chaining as
        :func:`~nest_integrations.decoding.chunk_chain.next_chunk`, over the whole datastore
        instead of a generation's candidates."""
        here = self.passages[index]
        starts = self._document_chunks(here.doc_id)
        after = bisect.bisect_right(starts, (here.doc_char_start, len(self.passages)))
        if after < len(starts) and here.continued_by(self.passages[starts[after][1]]):
            return starts[after][1]
        return None

    def preceding_chunk(self, index: int) -> int | None:
        """Index of the live passage that passage ``index`` goes on from in its document (the one
        whose :meth:`following_chunk` it is); None at the document's start and for a passage
        without a document."""
        here = self.passages[index]
        starts = self._document_chunks(here.doc_id)
        before = bisect.bisect_left(starts, (here.doc_char_start, -1)) - 1
        if before >= 0 and self.following_chunk(starts[before][1]) == index:
            return starts[before][1]
        return None

    def _document_chunks(self, doc_id: str) -> list[tuple[int, int]]:
        """``(doc_char_start, index)`` of the live passages of document ``doc_id``, sorted; [] for
        none (an empty ``doc_id``: a passage without a document)."""
        if not doc_id:
            return []
        with self._lock:
            if self._chunks_by_document is None:
                chunks: dict[str, list[tuple[int, int]]] = {}
                for i in sorted(self._index_by_id.values()):
                    passage = self.passages[i]
                    if passage.doc_id:
                        chunks.setdefault(passage.doc_id, []).append((passage.doc_char_start, i))
                for starts in chunks.values():
                    starts.sort()
                self._chunks_by_document = chunks
            return self._chunks_by_document.get(doc_id, [])

    @property
    def hidden_size(self) -> int:
        return self.encoder.lm.hidden_size

    @property
    def is_precomputed(self) -> bool:
        return self._precomputed is not None

    def fetch(self, indices: Sequence[int], stats: EncodeStats | None = None) -> list[EncodedPassage]:
        """Encoded passages for ``indices`` (encoding the ones not cached yet)."""
        pre = self._precomputed
        if pre is not None and all(i < pre.num_passages for i in indices):
            return [pre.passage(i) for i in indices]
        with self._lock:
            missing = [
                i for i in dict.fromkeys(indices) if i not in self._cache and (pre is None or i >= pre.num_passages)
            ]
        if missing:
            start = time.perf_counter()
            encoded = self._encode([self.passages[i].text for i in missing])
            if stats is not None:
                stats.encoded_passages += len(missing)
                stats.encode_passes += 1
                stats.encode_s += time.perf_counter() - start
            with self._lock:
                for i, enc in zip(missing, encoded):
                    self._put(i, enc)
        with self._lock:
            out = []
            for i in indices:
                if pre is not None and i < pre.num_passages:
                    out.append(pre.passage(i))
                    continue
                enc = self._cache.get(i)
                if enc is None:  # evicted between put and read: tiny cache
                    enc = self._encode([self.passages[i].text])[0]
                else:
                    self._cache.move_to_end(i)
                out.append(enc)
            return out

    def _encode(self, texts: Sequence[str]) -> list[EncodedPassage]:
        """Encode passages and store their keys with the datastore's codec."""
        return [store_keys(e, self.codec) for e in self.encoder.encode(texts)]

    def _put(self, index: int, encoded: EncodedPassage) -> None:
        if index in self._cache:
            return
        self._cache[index] = encoded
        self._cached_bytes += encoded.nbytes
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes

    def precompute(
        self, *, show_progress: bool = True, chunk_passages: int = 256,
        codec: KeyCodec | str | None = None, train_keys: int = DEFAULT_TRAIN_KEYS, seed: int = 0,
    ) -> float:
        """Encode every passage now; returns throughput in tokens per second.

        Before the bulk of the work the tokens are counted and the rate of a
        first small chunk gives an estimate of the whole run, logged at INFO and
        shown beside the progress bar (:class:`~nest_integrations.store.encode_progress.EncodeProgress`;
        with an untrained codec the first training chunk gives it).

        Args:
            codec: store keys with this codec (a :class:`KeyCodec` or its name,
                e.g. ``"opq96"``); None keeps the datastore's. An untrained codec
                is trained on ``train_keys`` entry keys sampled from the first
                passages encoded (chunks are kept as float16 until that many
                entries are seen, then every chunk is compressed as it comes),
                so at most ``train_keys`` float16 keys are held at once beyond
                one chunk. Training time counts in the throughput.
            train_keys: training sample size; more gives steadier centroids
                (FAISS advises 39 per centroid, ~10k) and slower training.
            seed: of the training sample.
        """
        from .encode_progress import EncodeProgress

        if train_keys < 1:
            raise ValueError(f"train_keys must be positive, got {train_keys}")
        codec = resolve_codec(self.codec if codec is None else codec, self.hidden_size)
        texts = [p.text for p in self.passages]
        with EncodeProgress(self.encoder, texts, show_progress=show_progress, desc="Encoding datastore") as progress:
            first: list[EncodedPassage] = []
            if not codec.is_trained:
                first = train_on_first_passages(
                    self.encoder, texts, codec, train_keys=train_keys, seed=seed, chunk_passages=chunk_passages,
                    on_chunk=progress.update,
                )
            encoded = [store_keys(e, codec) for e in first]
            encoded += progress.encode(len(first), chunk_passages, lambda e: store_keys(e, codec))
            seconds, tokens = progress.seconds, progress.tokens_done
        self.codec = codec
        self._precomputed = PrecomputedKeys.from_encoded(encoded, self.encoder, codec)
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0
        rate = tokens / max(seconds, 1e-9)
        logger.info(
            "Encoded %d passages, %d tokens in %.1f s (%.0f tokens/s), keys stored as %s (%d B/token)",
            len(encoded), tokens, seconds, rate, codec.spec, codec.bytes_per_key,
        )
        return rate

    def train_codec(
        self, codec: KeyCodec | str, *, sample_passages: int = 512, train_keys: int = DEFAULT_TRAIN_KEYS, seed: int = 0
    ) -> KeyCodec:
        """Train ``codec`` on the keys of a random sample of passages and store keys with it from now on.

        For lazy datastores (precompute trains its own codec): later fetches
        compress what they encode. Cached keys are dropped (they are in the old
        form).

        Args:
            sample_passages: passages encoded for the sample (their encoding
                time, an LM forward per passage, is paid here; docs/compression.md
                has the rate).
            train_keys: entry keys drawn from them for training.

        Raises:
            ValueError: the datastore is precomputed (its keys are stored with
                its codec already), or the codec does not fit the LM.
        """
        if self._precomputed is not None:
            raise ValueError(f"this datastore's keys are precomputed as {self.codec.spec}; rebuild the index to change codec")
        codec = resolve_codec(codec, self.hidden_size)
        if not codec.is_trained:
            live = sorted(self._index_by_id.values())
            rng = np.random.default_rng(seed)
            chosen = sorted(rng.choice(live, size=min(sample_passages, len(live)), replace=False).tolist()) if live else []
            sample = self.encoder.encode([self.passages[i].text for i in chosen])
            codec.train(sample_rows(_entry_keys(sample), train_keys, seed=seed))
        with self._lock:
            self.codec = codec
            self._cache.clear()
            self._cached_bytes = 0
        return codec

    def attach_precomputed(self, keys: "KeySource") -> None:
        """Serve the first ``keys.num_passages`` passages from precomputed arrays
        (flat, or :class:`~nest_integrations.store.shards.ShardedKeys`), and store lazily
        encoded passages with their codec."""
        if keys.num_passages > len(self.passages):
            raise ValueError(
                f"precomputed keys cover {keys.num_passages} passages but the datastore has {len(self.passages)}"
            )
        codec = keys.codec
        if codec.dim != self.hidden_size:
            raise ValueError(f"precomputed keys are {codec.dim}-d, the LM's hidden size is {self.hidden_size}")
        with self._lock:
            self.codec = codec
            self._cache.clear()
            self._cached_bytes = 0
            self._precomputed = keys

    @property
    def precomputed(self) -> "KeySource | None":
        return self._precomputed

    def candidates(
        self, indices: Sequence[int], *, normalize: bool = False, stats: EncodeStats | None = None
    ) -> "CandidateSet":
        """The searchable entries of the passages ``indices`` (duplicates dropped)."""
        unique = list(dict.fromkeys(int(i) for i in indices))
        return CandidateSet(unique, self.fetch(unique, stats), normalize=normalize, codec=self.codec)


def store_keys(encoded: EncodedPassage, codec: KeyCodec) -> EncodedPassage:
    """``encoded`` (float16 keys, as the encoder returns it) with its keys in ``codec``'s stored form.

    Raises:
        ValueError: ``codec`` compresses and is not trained.
    """
    if not codec.compresses:
        return encoded
    if not codec.is_trained:
        raise ValueError(f"the {codec.spec} key codec is not trained: precompute() or train_codec() first")
    return EncodedPassage(encoded.token_ids, encoded.char_spans, codec.encode(encoded.keys), encoded.valid)


def train_on_first_passages(
    encoder: PassageEncoder,
    texts: Sequence[str],
    codec: KeyCodec,
    *,
    train_keys: int = DEFAULT_TRAIN_KEYS,
    seed: int = 0,
    chunk_passages: int = 256,
    on_chunk: Callable[[list[EncodedPassage]], None] | None = None,
) -> list[EncodedPassage]:
    """Train ``codec`` on ``train_keys`` entry keys sampled from the first passages of ``texts``.

    Passages are encoded in chunks of ``chunk_passages`` from the first until
    ``train_keys`` entries are seen (or ``texts`` runs out), so at most
    ``train_keys`` float16 keys plus one chunk are held. The same texts, chunks
    and seed give the same codec whichever process runs this: the
    single-process :meth:`TokenDatastore.precompute` keeps the passages it
    returns, the Ray build trains on the driver and ships the codec's arrays to
    the workers.

    Args:
        on_chunk: called with each chunk as it is encoded (progress).

    Returns:
        The passages encoded, float16 keys (L, d) each: the first ``len(result)`` of ``texts``.

    Raises:
        ValueError: ``train_keys`` below 1, or a sample the codec cannot train on.
    """
    if train_keys < 1:
        raise ValueError(f"train_keys must be positive, got {train_keys}")
    encoded: list[EncodedPassage] = []
    entries = 0
    for lo in range(0, len(texts), chunk_passages):
        chunk = encoder.encode(texts[lo : lo + chunk_passages])
        if on_chunk is not None:
            on_chunk(chunk)
        encoded.extend(chunk)
        entries += sum(int(e.valid.sum()) for e in chunk)
        if entries >= train_keys:
            break
    codec.train(sample_rows(_entry_keys(encoded), train_keys, seed=seed))
    return encoded


def _entry_keys(encoded: Sequence[EncodedPassage]) -> np.ndarray:
    """float16 (n, d): the keys of the datastore entries (valid rows) of ``encoded``."""
    return np.concatenate([e.keys[e.valid] for e in encoded]) if encoded else np.zeros((0, 0), dtype=np.float16)
