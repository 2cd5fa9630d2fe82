"""Passages through the LM: the keys, values and character spans of the token datastore.

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

:class:`PassageEncoder` runs the LM; :class:`EncodedPassage` is one passage's
result, the unit every key source and the datastore hand around.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from nest_integrations.corpus.markdown_structure import copyable_tokens
from nest_integrations.model.key_reader import KeyReader
from nest_integrations.policy.conversation import plain_transcript

if TYPE_CHECKING:  # pragma: no cover
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
        key_layer: where keys are read; see :mod:`nest_integrations.model.key_reader`.
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
