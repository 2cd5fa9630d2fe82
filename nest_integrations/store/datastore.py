"""The token-level datastore: LM hidden states of corpus tokens, searched by the decoder.

Every passage is run through the LM on its own, after a fixed *encoding prefix*
(see :func:`resolve_encoding_prefix`). For passage token ``j`` the
datastore holds one entry:

* value: token ``j`` of the passage;
* key: the LM hidden state (``key_layer``) at the position just before it, the
  state from which the LM predicts it -- for ``j = 0`` the last prefix
  position, so an answer can be copied from the passage's first word;
* source: passage index, ``j`` and the token's character span.

Entries are excluded when their key sits at absolute position 0 (the attention
sink: its norm dwarfs the others', docs/method.md has SmolLM2's, and, left in, it pins the
RRC weight near 0), or when the key or value is a special token. Spans are proposed from
passage tokens only, so copying never runs past the end of a passage.

Two storage modes give identical neighbours:

* lazy (default): passages are encoded the first time they are retrieved and
  kept in an LRU cache bounded in megabytes;
* precomputed: :meth:`TokenDatastore.precompute` encodes the whole corpus once;
  saved datastores memory-map the arrays.

Keys are stored as the datastore's :mod:`key codec <nest_integrations.store.key_codec>`
writes them: float16 rows by default, or FAISS codes (``pq<M>``, ``opq<M>``,
``spq<M>``, ``sq8``) in either mode.

Search is vectorised over a :class:`CandidateSet` (the entries of the passages
retrieved for one generation), built once per generation: exact over float16
keys, asymmetric distance computation over codes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import numpy as np

from nest_integrations.core.safe_io import check_mapping
from nest_integrations.corpus.markdown_structure import copyable_tokens
from nest_integrations.corpus.passages import Passage
from nest_integrations.model.lm import KeyReader
from nest_integrations.policy.conversation import plain_transcript
from .key_codec import DEFAULT_TRAIN_KEYS, Float16Codec, KeyCodec, resolve_codec, sample_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from nest_integrations.model.lm import LoadedLM

logger = logging.getLogger(__name__)

CHAT_PREFIX = "chat"
"""Encoding prefix alias: the model's chat template opened on an assistant turn."""


def resolve_encoding_prefix(tokenizer: Any, prefix: str | None) -> str:
    """Turn an encoding-prefix setting into the literal text placed before each passage.

    Args:
        prefix: ``"chat"`` -- where an answer sits: an empty user turn followed
            by an opened assistant turn of the tokenizer's chat template, or, for
            a model without one (a base model), the open ``"Assistant:"`` line
            that ends the plain transcript it is prompted with
            (:func:`~nest_integrations.policy.conversation.plain_transcript`). Passages
            encoded this way have hidden states that match the decoder's query
            states at the start of an answer (the right passage is the first
            neighbour far more often than for bare passages: docs/method.md,
            Token datastore), so an answer can open with a passage's first
            words. ``None`` or ``"auto"`` -- ``"chat"``. Any other string is used
            literally (``""`` = bare passages).
    """
    if prefix in (None, "auto"):
        prefix = CHAT_PREFIX
    if prefix != CHAT_PREFIX:
        return prefix
    if not getattr(tokenizer, "chat_template", None):
        return plain_transcript([])
    return tokenizer.apply_chat_template([{"role": "user", "content": ""}], tokenize=False, add_generation_prompt=True)


@dataclass
class EncodedPassage:
    """One passage as the datastore sees it.

    Attributes:
        token_ids: int32 (L,), the passage tokens (no prefix, no special tokens).
        char_spans: int32 (L, 2), half-open character range of each token in the
            passage text. Ranges tile the text: token ``i`` starts where token
            ``i - 1`` ends, so a run of tokens maps to one verbatim slice.
        keys: (L, code_width) stored rows of the datastore's codec: ``keys[j]``
            stands for the hidden state just before token ``j`` (the last prefix
            position for ``j = 0``; zeros when there is no prefix). float16
            (L, d) as the encoder returns them; uint8 codes when compressed.
        valid: bool (L,), whether ``keys[j] -> token_ids[j]`` is a datastore entry
            (never for Markdown a reader does not see: a heading line, a comment,
            front matter, a link definition, HTML; see
            :func:`~nest_integrations.corpus.markdown_structure.copyable_tokens`).
    """

    token_ids: np.ndarray
    char_spans: np.ndarray
    keys: np.ndarray
    valid: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.token_ids.nbytes + self.char_spans.nbytes + self.keys.nbytes + self.valid.nbytes)


def tiling_char_spans(offsets: Sequence[tuple[int, int]], text_length: int) -> np.ndarray:
    """Make tokenizer offsets tile the text.

    Byte-level tokenizers report offsets without the leading space and give
    several tokens the same range when they split one character. Here token
    ``i`` covers ``[end(i-1), end(i))`` (the first starts at 0 and the last runs
    to ``text_length``), so the decoded text of tokens ``a..b`` is the passage
    text between ``spans[a, 0]`` and ``spans[b, 1]``.

    Returns:
        int32 (L, 2).
    """
    ends = np.maximum.accumulate(np.asarray([end for _, end in offsets], dtype=np.int64)) if offsets else np.zeros(0)
    spans = np.zeros((len(offsets), 2), dtype=np.int32)
    if len(offsets):
        ends[-1] = text_length
        spans[:, 1] = ends
        spans[1:, 0] = ends[:-1]
    return spans


class PassageEncoder:
    """Runs passages through the LM and returns their keys (see module docstring).

    Args:
        lm: the loaded LM (the same one the decoder uses).
        key_layer: where keys are read; see :mod:`nest_integrations.model.lm`.
        encoding_prefix: see :func:`resolve_encoding_prefix`.
        max_passage_tokens: the longest window encoded in one forward. A longer
            passage is encoded in overlapping windows of this many tokens, each
            after the last ``window_overlap`` tokens of the one before, so every
            token of every passage gets a key (and can be copied); a key then
            sees at least ``window_overlap`` tokens of its passage, not all of it.
            Bounds memory and the attention cost per forward.
        window_overlap: tokens of left context a window repeats from the one
            before (their keys are taken from the earlier window); must be
            below ``max_passage_tokens``.
        batch_tokens: padded tokens per forward batch. Larger is faster only
            while activations fit in the CPU caches (docs/serving.md, Speed,
            has SmolLM2's figures).
    """

    def __init__(
        self,
        lm: "LoadedLM",
        key_layer: str = "ffn_input",
        encoding_prefix: str | None = "auto",
        *,
        max_passage_tokens: int = 512,
        window_overlap: int = 128,
        batch_tokens: int = 1024,
    ):
        if max_passage_tokens < 2:
            raise ValueError("max_passage_tokens must be at least 2")
        if not 0 < window_overlap < max_passage_tokens:
            raise ValueError(f"window_overlap must be in [1, max_passage_tokens), got {window_overlap}")
        if batch_tokens < max_passage_tokens:
            raise ValueError("batch_tokens must be at least max_passage_tokens")
        self.lm = lm
        self.key_layer = key_layer
        self.reader = KeyReader(lm.model, key_layer)
        self.prefix_text = resolve_encoding_prefix(lm.tokenizer, encoding_prefix)
        self.prefix_ids: list[int] = lm.tokenizer(self.prefix_text, add_special_tokens=False)["input_ids"]
        if not self.prefix_ids and getattr(lm.tokenizer, "bos_token_id", None) is not None and getattr(
            lm.tokenizer, "add_bos_token", False
        ):
            self.prefix_ids = [lm.tokenizer.bos_token_id]
        self.max_passage_tokens = max_passage_tokens
        self.window_overlap = window_overlap
        self.batch_tokens = batch_tokens
        self._special_ids = np.asarray(sorted(set(lm.tokenizer.all_special_ids)), dtype=np.int64)

    def tokenize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Passage tokens and their tiling char spans: int32 (L,), int32 (L, 2). Never truncated."""
        enc = self.lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return np.asarray(enc["input_ids"], dtype=np.int32), tiling_char_spans(enc["offset_mapping"], len(text))

    def windows(self, length: int) -> list[tuple[int, int, int]]:
        """``(start, end, keep_from)`` token windows covering a passage of ``length`` tokens.

        Window ``[start, end)`` is encoded in one forward; keys of tokens
        ``[keep_from, end)`` are kept (``keep_from = start`` for the first window,
        ``start + window_overlap`` after it), so the kept ranges tile ``[0, length)``.
        """
        if length <= self.max_passage_tokens:
            return [(0, length, 0)]
        stride = self.max_passage_tokens - self.window_overlap
        out = [(0, self.max_passage_tokens, 0)]
        while out[-1][1] < length:
            start = out[-1][1] - self.window_overlap
            out.append((start, min(start + self.max_passage_tokens, length), start + self.window_overlap))
        assert all(b - a <= self.max_passage_tokens for a, b, _ in out) and stride > 0
        return out

    def _valid_mask(self, token_ids: np.ndarray) -> np.ndarray:
        """Entry ``j`` needs a key at absolute position >= 1 (not the attention
        sink), a non-special value, and a non-special token before it."""
        n_prefix = len(self.prefix_ids)
        key_position = n_prefix + np.arange(len(token_ids)) - 1
        special = np.isin(token_ids, self._special_ids)
        before_special = np.concatenate([[False], special[:-1]])
        return (key_position >= 1) & ~special & ~before_special

    def encode(self, texts: Sequence[str]) -> list[EncodedPassage]:
        """Encode passages (long ones in :meth:`windows`), batched by padded length; order is preserved."""
        tokenized = [self.tokenize(text) for text in texts]
        pieces = [(i, *w) for i, (ids, _) in enumerate(tokenized) for w in self.windows(len(ids))]
        if any(len(self.windows(len(ids))) > 1 for ids, _ in tokenized):
            logger.debug("encoding %d passages in %d windows of at most %d tokens", len(texts), len(pieces), self.max_passage_tokens)
        order = sorted(range(len(pieces)), key=lambda j: pieces[j][2] - pieces[j][1])
        piece_keys: list[np.ndarray | None] = [None] * len(pieces)
        batch: list[int] = []

        def flush() -> None:
            if batch:
                windows = [tokenized[pieces[j][0]][0][pieces[j][1] : pieces[j][2]] for j in batch]
                for j, keys in zip(batch, self._forward(windows)):
                    _, start, _, keep_from = pieces[j]
                    piece_keys[j] = keys[keep_from - start :]
                batch.clear()

        n_prefix = len(self.prefix_ids)
        for j in order:
            padded_len = n_prefix + pieces[j][2] - pieces[j][1]
            if batch and padded_len * (len(batch) + 1) > self.batch_tokens:
                flush()
            batch.append(j)
        flush()
        by_passage: dict[int, list[np.ndarray]] = {}
        for (i, *_), keys in zip(pieces, piece_keys):  # pieces are in passage, then window order
            assert keys is not None
            by_passage.setdefault(i, []).append(keys)
        results = []
        for i, (ids, spans) in enumerate(tokenized):
            keys = np.concatenate(by_passage[i])
            assert len(keys) == len(ids), "windows must tile the passage"
            results.append(EncodedPassage(ids, spans, keys, self._valid_mask(ids) & copyable_tokens(texts[i], spans)))
        return results

    def _forward(self, passages_ids: list[np.ndarray]) -> list[np.ndarray]:
        """One padded forward; returns float16 keys (L_i, d) per passage.

        A float32 model on a CPU with bfloat16 instructions runs it on a
        bfloat16 copy of itself (:mod:`nest_integrations.store.key_precision`).
        """
        import torch

        from .key_precision import encoding_model

        n_prefix = len(self.prefix_ids)
        width = n_prefix + max(len(ids) for ids in passages_ids)
        pad = self.lm.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(passages_ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(passages_ids), width), dtype=torch.long)
        for row, ids in enumerate(passages_ids):
            seq = self.prefix_ids + ids.tolist()
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        device = self.lm.device
        model, reader = encoding_model(self.lm, self.reader)
        with torch.inference_mode(), self.lm.forward_lock, reader.capture() as captured:
            outputs = model(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                use_cache=False,
                logits_to_keep=1,
                **reader.forward_kwargs(),
            )
            keys = reader.keys_from(captured, outputs)
        keys = keys.to(torch.float16).cpu().numpy()
        out = []
        for ids in passages_ids:
            row = len(out)
            # keys[j] = state before token j: rows n_prefix-1 .. n_prefix+L-2.
            passage_keys = np.zeros((len(ids), keys.shape[-1]), dtype=np.float16)
            lo = max(n_prefix - 1, 0)
            hi = n_prefix + len(ids) - 1
            passage_keys[len(ids) - (hi - lo) :] = keys[row, lo:hi]
            out.append(passage_keys)
        return out


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


class KeySource(Protocol):
    """Precomputed keys as the datastore serves them: :class:`PrecomputedKeys` (flat
    arrays), :class:`~nest_integrations.store.shards.ShardedKeys` (one set per shard of a
    saved index) or :class:`~nest_integrations.index.store_keys.KeySegments` (a vector
    store's saved and added keys). Those modules build on this one; the protocol is
    what lets the datastore serve them without importing them."""

    @property
    def num_passages(self) -> int:
        """Passages covered: the first ``num_passages`` of the datastore."""
        ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_entries(self) -> int: ...

    @property
    def key_bytes(self) -> int: ...

    @property
    def key_width(self) -> int:
        """Row width of the stored keys (the LM's hidden size for float16 keys)."""
        ...

    @property
    def codec(self) -> KeyCodec:
        """How the keys are stored."""
        ...

    def passage(self, index: int) -> EncodedPassage:
        """The encoding of passage ``index``."""
        ...


@dataclass
class PrecomputedKeys:
    """Every passage's encoding in flat arrays (memory-mappable).

    Attributes:
        token_ids: int32 (M,), all passage tokens back to back.
        char_spans: int32 (M, 2).
        keys: (M, codec.code_width) ``codec.code_dtype``: float16 (M, d) keys,
            or their codes.
        valid: bool (M,).
        offsets: int64 (P + 1,), passage ``p`` owns rows ``offsets[p]:offsets[p+1]``.
        codec: how ``keys`` are stored (None: float16 of the keys' width).
    """

    token_ids: np.ndarray
    char_spans: np.ndarray
    keys: np.ndarray
    valid: np.ndarray
    offsets: np.ndarray
    codec: KeyCodec = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        m = len(self.token_ids)
        if self.codec is None:
            self.codec = Float16Codec(self.keys.shape[1])
        assert self.token_ids.dtype == np.int32 and self.token_ids.ndim == 1
        assert self.char_spans.shape == (m, 2) and self.char_spans.dtype == np.int32
        assert self.keys.shape == (m, self.codec.code_width) and self.keys.dtype == self.codec.code_dtype
        assert self.valid.shape == (m,) and self.valid.dtype == np.bool_
        assert self.offsets.dtype == np.int64 and self.offsets[0] == 0 and self.offsets[-1] == m

    @property
    def num_passages(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_entries(self) -> int:
        return int(self.valid.sum())

    @property
    def key_bytes(self) -> int:
        return int(self.keys.nbytes)

    @property
    def key_width(self) -> int:
        """Row width of ``keys`` (the LM's hidden size for float16 keys)."""
        return int(self.keys.shape[1])

    def passage(self, index: int) -> EncodedPassage:
        """Passage ``index``'s rows (views, not copies).

        Raises:
            ValueError: a memory-mapped array's file was truncated in place since it was
                loaded (:func:`~nest_integrations.core.safe_io.check_mapping`): reading it would be a SIGBUS.
        """
        for array in (self.token_ids, self.char_spans, self.keys, self.valid, self.offsets):
            check_mapping(array)
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        return EncodedPassage(self.token_ids[lo:hi], self.char_spans[lo:hi], self.keys[lo:hi], self.valid[lo:hi])

    @classmethod
    def from_encoded(
        cls, encoded: Sequence[EncodedPassage], encoder: PassageEncoder, codec: KeyCodec | None = None
    ) -> "PrecomputedKeys":
        """Flatten passages whose keys are already stored with ``codec`` (None: float16 from ``encoder``)."""
        codec = codec if codec is not None else Float16Codec(encoder.lm.hidden_size)
        lengths = np.asarray([len(e.token_ids) for e in encoded], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

        def stack(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype))

        return cls(
            token_ids=stack([e.token_ids for e in encoded], (0,), np.int32),
            char_spans=stack([e.char_spans for e in encoded], (0, 2), np.int32),
            keys=stack([e.keys for e in encoded], (0, codec.code_width), codec.code_dtype),
            valid=stack([e.valid for e in encoded], (0,), np.bool_),
            offsets=offsets,
            codec=codec,
        )


@dataclass
class Neighbours:
    """Top-r datastore entries for T query vectors, best first.

    All arrays are (T, r) torch tensors; ``r`` is ``min(k, available entries)``.
    ``scores`` are ``-||q - k||^2`` (float32; ``-inf`` marks masked entries when
    fewer than r unmasked ones exist); with compressed keys ``k`` is the key
    the codes stand for, so scores are approximate but in the same units.
    ``entries`` index into the CandidateSet.
    """

    scores: "torch.Tensor"
    values: "torch.Tensor"
    entries: "torch.Tensor"


@dataclass
class CandidateSet:
    """The datastore entries of one generation's retrieved passages, ready to search.

    Built once per generation (the passages do not change while decoding), so
    each decoding step is one matrix product (float16 keys) or one lookup-table
    pass over the codes (compressed keys). Entry ``e`` is key ``keys[e]`` ->
    value token ``values[e]`` at token position ``positions[e]`` of passage
    ``passage_index[e]``; ``keys`` is the codec's search form of the stored
    rows (float32 (n, d) for float16 keys, see
    :meth:`~nest_integrations.store.key_codec.KeyCodec.prepare`).

    ``used`` marks entries already copied; :meth:`search` skips them so the same
    span is not proposed over and over.
    """

    passage_indices: list[int]
    encoded: list[EncodedPassage]
    normalize: bool = False
    codec: KeyCodec | None = None
    """How the passages' keys are stored; None: float16."""
    keys: Any = field(init=False)
    values: "torch.Tensor" = field(init=False)
    passage_index: np.ndarray = field(init=False)
    positions: np.ndarray = field(init=False)
    used: "torch.Tensor" = field(init=False)

    def __post_init__(self) -> None:
        import torch

        if self.codec is None:
            self.codec = Float16Codec(self.encoded[0].keys.shape[1] if self.encoded else 1)
        codec = self.codec
        keys, values, owners, positions = [], [], [], []
        self._entry_of: dict[tuple[int, int], int] = {}
        for pidx, enc in zip(self.passage_indices, self.encoded):
            rows = np.flatnonzero(enc.valid)
            assert enc.keys.dtype == codec.code_dtype and enc.keys.shape[1:] == (codec.code_width,), "keys not in the codec's form"
            keys.append(enc.keys[rows])
            values.append(enc.token_ids[rows].astype(np.int64))
            owners.append(np.full(len(rows), pidx, dtype=np.int64))
            positions.append(rows.astype(np.int64))
        self.keys = codec.prepare(np.concatenate(keys) if keys else np.zeros((0, codec.code_width), dtype=codec.code_dtype))
        self.key_sq = codec.squared_norms(self.keys)
        # Normalised search compares q / |q| with k / |k| (cosine); zero keys stay zero.
        self._inv_norm = self.key_sq.sqrt().clamp_min(1e-12).reciprocal() if self.normalize else None
        self.values = torch.from_numpy(np.concatenate(values)) if values else torch.zeros(0, dtype=torch.long)
        self.passage_index = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
        self.positions = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
        for e, (p, pos) in enumerate(zip(self.passage_index.tolist(), self.positions.tolist())):
            self._entry_of[(p, pos)] = e
        self.used = torch.zeros(len(self.values), dtype=torch.bool)
        self._by_passage = dict(zip(self.passage_indices, self.encoded))

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def search(self, queries: "torch.Tensor", k: int) -> Neighbours:
        """Top-k by squared L2 distance, ``||q||^2 - 2 q.k + ||k||^2`` with the
        codec's inner products and norms (exact for float16 keys).

        Args:
            queries: float (T, d) query vectors (normalised here when the set is).
            k: neighbours per query; capped at the number of entries.
        """
        import torch

        assert queries.ndim == 2, f"queries must be (T, d), got {tuple(queries.shape)}"
        queries = queries.float()
        if self.normalize:
            queries = torch.nn.functional.normalize(queries, dim=-1)
        k = min(k, len(self))
        if k == 0:
            empty = torch.zeros((queries.shape[0], 0))
            return Neighbours(empty, empty.long(), empty.long())
        assert self.codec is not None
        ip = self.codec.inner_products(queries, self.keys)
        key_sq = self.key_sq
        if self._inv_norm is not None:
            ip, key_sq = ip * self._inv_norm, key_sq * self._inv_norm**2
        dist = (queries * queries).sum(-1, keepdim=True) - 2.0 * ip + key_sq
        scores = -dist.clamp_min(0.0)
        if bool(self.used.any()):
            scores = scores.masked_fill(self.used, float("-inf"))
        top_scores, top_entries = scores.topk(k, dim=-1)
        return Neighbours(top_scores, self.values[top_entries], top_entries)

    def mark_used(self, passage_index: int, first_position: int, last_position: int) -> None:
        """Mask the entries whose values are tokens ``first..last`` of a passage."""
        for pos in range(first_position, last_position + 1):
            e = self._entry_of.get((passage_index, pos))
            if e is not None:
                self.used[e] = True

    def is_used(self, passage_index: int, position: int) -> bool:
        """Whether the entry whose value is token ``position`` of a passage is masked
        (already copied, or outside an answer window); False for a token with no entry."""
        e = self._entry_of.get((passage_index, position))
        return e is not None and bool(self.used[e])

    def passage(self, passage_index: int) -> EncodedPassage:
        return self._by_passage[passage_index]

    def entry_source(self, entry: int) -> tuple[int, int]:
        """(passage index, value token position) of an entry."""
        return int(self.passage_index[entry]), int(self.positions[entry])
