"""Plain sentence-transformers folders run through transformers alone, for start-up.

A folder saved by sentence-transformers whose pipeline is a Hugging Face encoder, a
pooling and optionally an L2 normalisation (all-MiniLM-L6-v2, the bundled default, and
most of its family) needs nothing of sentence-transformers to embed a sentence: tokenize
(padded to the longest, truncated to ``max_seq_length``), run the encoder, pool the token
states under the attention mask, normalise. Importing sentence-transformers, though, costs
a one-shot command more than loading the model: its package imports its trainers,
scikit-learn and SciPy, which transformers alone does not (``nest bench startup``;
docs/serving.md). :func:`plain_sentence_model` reads such a folder's configuration and
:class:`TransformerSentenceEmbedder` embeds with it; any other folder (a prompt, a dense
layer, weighted-mean or last-token pooling, lower-casing added on top of the tokenizer,
a hub name...) returns None and is loaded by sentence-transformers itself
(:func:`nest_integrations.retrieval.dense.load_embedder`).

The embeddings equal sentence-transformers' for the same batches (the same tokenizer
call, encoder and pooling arithmetic); ``tests/test_sentence_encoder.py`` checks it on
bundled passages, and retrieval over them.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["POOLING_MODES", "PlainSentenceModel", "TransformerSentenceEmbedder", "plain_sentence_model"]

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
"""Poolings run here; sentence-transformers' others (weightedmean, lasttoken, several at once) are left to it."""

_MODULE_TYPES = {
    "transformer": "sentence_transformers.models.Transformer",
    "pooling": "sentence_transformers.models.Pooling",
    "normalize": "sentence_transformers.models.Normalize",
}
# Pooling/config.json's boolean switches (the format all-MiniLM-L6-v2 was saved in), in
# sentence-transformers' order; none set means mean.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_POOLING_KEYS = {"word_embedding_dimension", "embedding_dimension", "pooling_mode", "include_prompt", *_LEGACY_POOLING_KEYS}
_NORMALIZE_DEFAULTS = {"module_input_name": "sentence_embedding", "module_output_name": None}
# Model-level settings that do not change what encode() computes without prompts.
_INERT_MODEL_KEYS = {"__version__", "similarity_fn_name", "model_type", "prompts", "default_prompt_name"}


@dataclass(frozen=True)
class PlainSentenceModel:
    """A sentence-transformers folder that is an encoder, one pooling and maybe a normalisation.

    Attributes:
        folder: the model folder (the encoder's weights and tokenizer at its root).
        pooling: one of :data:`POOLING_MODES`.
        normalize: the pipeline ends in an L2 normalisation.
        max_seq_length: tokens kept per text (sentence_bert_config.json); None: the
            tokenizer's own limit, capped at the encoder's positions.
    """

    folder: Path
    pooling: str
    normalize: bool
    max_seq_length: Optional[int]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def plain_sentence_model(name_or_path: str | Path) -> Optional[PlainSentenceModel]:
    """The plain pipeline saved in the local folder ``name_or_path``; None for anything else
    (not a local folder, other modules or settings, an unreadable configuration)."""
    folder = Path(name_or_path)
    try:
        if not (folder / "modules.json").is_file():
            return None
        modules = _read_json(folder / "modules.json")
        kinds = [next((k for k, t in _MODULE_TYPES.items() if t == m.get("type")), None) for m in modules]
        if kinds not in (["transformer", "pooling"], ["transformer", "pooling", "normalize"]):
            return None
        if any(set(m) - {"idx", "name", "path", "type"} for m in modules) or modules[0].get("path", "") != "":
            return None
        settings = _read_json(folder / "sentence_bert_config.json") if (folder / "sentence_bert_config.json").is_file() else {}
        if set(settings) - {"max_seq_length", "do_lower_case"} or settings.get("do_lower_case", False):
            return None
        if (folder / "config_sentence_transformers.json").is_file():
            model_settings = _read_json(folder / "config_sentence_transformers.json")
            prompts = model_settings.get("prompts") or {}
            if set(model_settings) - _INERT_MODEL_KEYS or any(prompts.values()) or model_settings.get("default_prompt_name"):
                return None
        pooling = _pooling_mode(_read_json(folder / modules[1]["path"] / "config.json"))
        if pooling is None:
            return None
        if len(modules) == 3:
            normalize_config = folder / modules[2]["path"] / "config.json"
            if normalize_config.is_file() and any(_NORMALIZE_DEFAULTS.get(k, k) != v for k, v in _read_json(normalize_config).items()):
                return None
        max_seq_length = settings.get("max_seq_length")
        if _read_json(folder / "config.json").get("is_encoder_decoder") or not isinstance(max_seq_length, (int, type(None))):
            return None
    except (OSError, ValueError, TypeError, AttributeError, KeyError, IndexError):
        return None
    return PlainSentenceModel(folder, pooling, len(modules) == 3, max_seq_length)


def _pooling_mode(config: dict[str, Any]) -> Optional[str]:
    """The single pooling of a Pooling/config.json, in its current or legacy form; None if
    it pools in another way or several at once."""
    if not isinstance(config, dict) or set(config) - _POOLING_KEYS:
        return None
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        mode = mode[0] if isinstance(mode, list) and len(mode) == 1 else mode
    else:
        modes = [name for key, name in _LEGACY_POOLING_KEYS.items() if config.get(key)]
        mode = modes[0] if len(modes) == 1 else ("mean" if not modes else None)
    return mode if mode in POOLING_MODES else None


class TransformerSentenceEmbedder:
    """Embeds sentences with a :class:`PlainSentenceModel` through transformers (no sentence-transformers).

    Args:
        model: the folder's pipeline.
        device: torch device string, e.g. ``"cpu"``.
    """

    def __init__(self, model: PlainSentenceModel, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        self.spec = model
        self.device = device
        # A fast tokenizer sets its padding and truncation on its Rust state at each call:
        # two threads calling it at once can fail ("Already borrowed"). Serving threads embed
        # their queries concurrently, so the calls take turns; the forwards need not.
        self._tokenizer_lock = threading.Lock()
        folder = str(model.folder)
        limit = {} if model.max_seq_length is None else {"model_max_length": model.max_seq_length}
        self.tokenizer = AutoTokenizer.from_pretrained(folder, **limit)
        self.model = AutoModel.from_pretrained(folder).to(device).eval()
        positions = getattr(self.model.config, "max_position_embeddings", -1)
        if model.max_seq_length is None and positions not in (None, -1):  # as sentence-transformers caps it
            self.tokenizer.model_max_length = min(self.tokenizer.model_max_length, positions)

    def encode(self, sentences: list[str], batch_size: int = 64) -> np.ndarray:
        """float32 (len(sentences), d): the sentences' embeddings, one padded forward per
        ``batch_size`` of them, in the order given (padding memory grows with the batch
        times its longest text; :func:`~nest_integrations.retrieval.dense.embed_texts`
        sends texts of similar lengths together)."""
        import torch

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(sentences), batch_size):
                with self._tokenizer_lock:
                    features = self.tokenizer(
                        sentences[start : start + batch_size], padding=True, truncation="longest_first", return_tensors="pt"
                    )
                features = features.to(self.device)
                tokens = self.model(**features, return_dict=True).last_hidden_state
                pooled = _pool(tokens, features["attention_mask"], self.spec.pooling)
                if self.spec.normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                chunks.append(pooled.float().cpu().numpy())
        return np.concatenate(chunks) if chunks else np.zeros((0, self.dimension), dtype=np.float32)

    @property
    def dimension(self) -> int:
        """Embedding width: the encoder's hidden size (each pooling keeps it)."""
        return int(self.model.config.hidden_size)


def _pool(tokens: Any, attention_mask: Any, mode: str) -> Any:
    """(n, d) pooled from token states (n, L, d) under ``attention_mask`` (n, L): the
    arithmetic of sentence-transformers' Pooling, so that the sums round alike."""
    import torch

    if mode == "cls":
        first = attention_mask.to(torch.int).argmax(dim=1)
        return torch.gather(tokens, 1, first.view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])).squeeze(1)
    if mode == "max":
        mask = attention_mask.unsqueeze(-1).expand_as(tokens).to(tokens.dtype)
        return tokens.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    accumulate = torch.float32 if tokens.dtype in (torch.float16, torch.bfloat16) else tokens.dtype
    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    total = (tokens * mask).sum(dim=1, dtype=accumulate)
    count = torch.clamp(mask.sum(dim=1, dtype=accumulate), min=1e-9)
    return (total / (count if mode == "mean" else torch.sqrt(count))).to(tokens.dtype)
