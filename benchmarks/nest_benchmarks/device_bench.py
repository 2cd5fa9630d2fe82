"""NEST against the LM's own ``generate`` on an accelerator, per model and dtype (``nest bench device``).

:func:`run_device_bench` answers, for each model and dtype in one process: how
fast does the decoder write on this device next to plain Hugging Face greedy
decoding, and does it still copy? For each ``(model, dtype)`` it

* loads the LM on the device (timed; a load that fails, e.g. a dtype the device
  does not support, becomes a row with the error and the bench goes on);
* builds an index over the first ``passages`` Wikipedia summaries about people,
  its token keys precomputed on the device (timed, with the encoding rate), and
  fits the alpha/tau calibration (timed apart, so no generation pays for it);
* runs one untimed warm-up item through all three contenders (kernels, the
  allocator and the KV cache sizes settle before timing);
* times, for ``n`` biography items, back to back per item so load drift hits
  all three alike: (a) ``model.generate`` (greedy, ``max_new_tokens``, stopping
  at the decoder's end-of-sequence ids) on the prompt ids the decoder feeds,
  i.e. ``decoder.format_prompt(prompt, decoder.config)`` tokenised; (b) the
  decoder in ``base`` mode (the LM alone through NEST's loop); (c) ``nest``
  mode (retrieval, gate and copying included in its time).

Each timing is wall time around the call, with ``torch.cuda.synchronize()``
before and after on CUDA, so queued kernels are counted where they ran. Rates
are generated tokens / summed wall seconds (tokens after each contender's own
stop: ``generate`` and base stop at EOS, nest may also stop where its source
ends, so the ratios compare rates, not totals).

Writes ``device_bench.json`` and ``device_bench.md`` to ``out_dir`` after every
row, so a run cut short by a time limit keeps the rows it finished.
"""

from __future__ import annotations

import gc
import logging
import math
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import torch

from nest_integrations import LoadedLM, NestDecoder, NestIndex, Passage, load_lm, load_wikipedia_summaries
from .bench import hf_generate, peak_rss_mib, prompt_ids
from .metrics import tokens_per_forward
from .runner import markdown_table, ratio, run_metadata, write_json
from .tasks import EvalItem, bio_items

__all__ = ["DEVICE_BENCH_DTYPES", "check_device", "check_dtypes", "run_device_bench"]

logger = logging.getLogger(__name__)

DEVICE_BENCH_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
"""The dtypes :func:`~nest_integrations.model.lm.load_lm` takes."""

CONTENDERS: tuple[str, ...] = ("generate", "base", "nest")
"""What each item is timed with: HF ``generate``, then the decoder's base and nest modes."""

T = TypeVar("T")


# --------------------------------------------------------------------------- options


def check_dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    """The dtypes, checked.

    Raises:
        ValueError: none given, or one that is not in :data:`DEVICE_BENCH_DTYPES`.
    """
    if not dtypes:
        raise ValueError(f"no dtype given; choose from {', '.join(DEVICE_BENCH_DTYPES)}")
    unknown = [d for d in dtypes if d not in DEVICE_BENCH_DTYPES]
    if unknown:
        raise ValueError(f"unknown dtype {', '.join(map(repr, unknown))}; choose from {', '.join(DEVICE_BENCH_DTYPES)}")
    return tuple(dtypes)


def check_device(device: str) -> str:
    """``device`` if this process can run on it (``cpu``, ``cuda``, ``cuda:<i>``, ``mps``).

    Raises:
        ValueError: not a torch device, or CUDA/MPS absent (the message says whether
            the installed torch is a CPU-only build, the usual cause on a GPU machine).
    """
    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"{device!r} is not a torch device ({err})") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ValueError(f"{device!r}: CUDA is not available (torch {torch.__version__}, {build})")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"{device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{device!r}: MPS is not available")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{device!r}: the bench runs on cpu, cuda[:i] or mps")
    return device


def _environment(device: str) -> dict[str, Any]:
    """Versions and hardware a reader needs to compare two runs."""
    import transformers

    env: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


# --------------------------------------------------------------------------- timing


def _timed(call: Callable[[], T], cuda: bool) -> tuple[float, T]:
    """``(wall seconds, result)`` of ``call()``; on CUDA synchronised before and after, so
    the time covers the kernels the call queued, not just their launch."""
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def _time_item(decoder: NestDecoder, item: EvalItem, max_new_tokens: int, cuda: bool) -> dict[str, Any]:
    """The three contenders on one item, back to back.

    Returns:
        ``{"id", "generate": {new_tokens, wall_s, text}, "base"/"nest": {new_tokens,
        wall_s, forward_passes, retrieval_s, attribution_ratio, finish_reason, text}}``.
    """
    lm = decoder.lm
    ids = prompt_ids(decoder, item.prompt)  # the chat-formatted prompt the decoder feeds, cut as it cuts it
    eos = sorted(decoder.eos_ids)
    seconds, (row,) = _timed(
        lambda: hf_generate(lm, [ids], max_new_tokens, stop_ids=eos, eos_token_id=eos)[1], cuda
    )
    runs: dict[str, Any] = {
        "id": item.id,
        "generate": {
            "new_tokens": len(row),
            "wall_s": seconds,
            "text": lm.tokenizer.decode(row, skip_special_tokens=True),
        },
    }
    for mode in ("base", "nest"):
        seconds, output = _timed(lambda: decoder.generate(item.prompt, query=item.query, mode=mode), cuda)
        runs[mode] = {
            "new_tokens": output.stats.new_tokens,
            "wall_s": seconds,
            "forward_passes": output.stats.forward_passes,
            "retrieval_s": output.stats.retrieval_s,
            "attribution_ratio": output.attribution_ratio,
            "finish_reason": output.stats.finish_reason,
            "text": output.text,
        }
    return runs


def _contender_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over items: ``new_tokens``, ``wall_s`` (seconds), ``tokens_per_s``, and for the
    decoder's modes ``forward_passes``, ``tokens_per_forward`` (each prefill excluded: greedy decoding
    gives about 1.0, copying more), ``retrieval_s`` and the mean ``attribution_ratio``."""
    tokens = sum(r["new_tokens"] for r in runs)
    wall = math.fsum(r["wall_s"] for r in runs)
    summary: dict[str, Any] = {"new_tokens": tokens, "wall_s": wall, "tokens_per_s": ratio(tokens, wall)}
    if "forward_passes" in runs[0]:
        forwards = sum(r["forward_passes"] for r in runs)
        summary["forward_passes"] = forwards
        summary["tokens_per_forward"] = tokens_per_forward({"new_tokens": tokens, "forward_passes": forwards}, len(runs))
        summary["retrieval_s"] = math.fsum(r["retrieval_s"] for r in runs)
        summary["attribution_ratio"] = math.fsum(r["attribution_ratio"] for r in runs) / len(runs)
    return summary


# --------------------------------------------------------------------------- one row


def _bench_lm(lm: LoadedLM, corpus: Sequence[Passage], items: Sequence[EvalItem], max_new_tokens: int, cuda: bool) -> dict[str, Any]:
    """The measured part of a row: build, calibrate, warm up on ``items[0]``, time ``items[1:]``."""
    row: dict[str, Any] = {}
    row["build_s"], index = _timed(
        lambda: NestIndex.build(list(corpus), lm, precompute_keys=True, show_progress=False, calibrate=False), cuda
    )
    row["precompute_tokens_per_s"] = index.precompute_rate
    row["calibration_s"], _ = _timed(lambda: index.calibration(show_progress=False), cuda)
    decoder = index.decoder()
    decoder.config = decoder.config.updated(max_new_tokens=max_new_tokens)
    _time_item(decoder, items[0], max_new_tokens, cuda)  # untimed warm-up
    timed = [_time_item(decoder, item, max_new_tokens, cuda) for item in items[1:]]
    row.update(_row_summary(timed))
    row["peak_gpu_mib"] = torch.cuda.max_memory_allocated(lm.device) / 2**20 if cuda else None
    row["peak_rss_mib"] = peak_rss_mib()
    row["run"] = run_metadata(index, decoder.config)
    row["items"] = timed
    return row


def _bench_row(model: str, dtype: str, device: str, corpus: Sequence[Passage], items: Sequence[EvalItem], max_new_tokens: int) -> dict[str, Any]:
    """One row of the table: load ``model`` in ``dtype`` on ``device`` (timed), then :func:`_bench_lm`.

    An exception while loading or running becomes the row's ``error`` with ``failed_at``
    ``"load"`` or ``"run"`` (logged with its traceback): on a device run that has one
    shot, a dtype the device lacks must not cost the other models' rows.
    """
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    row: dict[str, Any] = {"model": model, "dtype": dtype, "failed_at": None, "error": None}
    stage = "load"
    try:
        row["load_s"], lm = _timed(lambda: load_lm(model, device=device, dtype=dtype), cuda)
        stage = "run"
        row.update(_bench_lm(lm, corpus, items, max_new_tokens, cuda))
    except Exception as err:  # noqa: BLE001 - see the docstring
        logger.exception("device bench: %s %s failed at %s", model, dtype, stage)
        row.update(failed_at=stage, error=f"{type(err).__name__}: {err}")
    return row


def _row_summary(timed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per contender totals, the rate ratios and the copy/agreement shares of one row.

    ``copied_share``: items whose nest text copied anything (attribution > 0);
    ``base_equals_generate``: items where base mode wrote the text ``generate``
    wrote (the decoder's loop is greedy too; a mismatch flags numerics that
    differ between the two paths, usual in half precision, worth a look otherwise).
    """
    summary = {name: _contender_summary([t[name] for t in timed]) for name in CONTENDERS}
    rates = {name: summary[name]["tokens_per_s"] for name in CONTENDERS}
    return {
        "n": len(timed),
        **summary,
        "nest_vs_generate": ratio(rates["nest"], rates["generate"]),
        "base_vs_generate": ratio(rates["base"], rates["generate"]),
        "nest_vs_base": ratio(rates["nest"], rates["base"]),
        "copied_share": sum(t["nest"]["attribution_ratio"] > 0 for t in timed) / len(timed),
        "base_equals_generate": sum(t["base"]["text"].strip() == t["generate"]["text"].strip() for t in timed) / len(timed),
    }


def _release(device: str) -> None:
    """Free the previous row's tensors before the next model loads."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- report


_COLUMNS: tuple[tuple[str, str], ...] = (
    ("load_s", "load s"),
    ("build_s", "build s"),
    ("precompute_tokens_per_s", "keys tok/s"),
    ("generate.tokens_per_s", "generate tok/s"),
    ("base.tokens_per_s", "base tok/s"),
    ("nest.tokens_per_s", "nest tok/s"),
    ("nest_vs_generate", "nest / generate"),
    ("nest.tokens_per_forward", "nest tok/fwd"),
    ("copied_share", "copied share"),
    ("base_equals_generate", "base = generate"),
    ("peak_gpu_mib", "peak GPU MiB"),
)


def _cell(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, ``a.b`` reading a nested field; None where the row has no such field (error rows)."""
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _markdown(bench: Mapping[str, Any]) -> str:
    """``device_bench.md``: run facts, one table row per model x dtype, errors below."""
    env, options = bench["environment"], bench["options"]
    rows = [[r["model"], r["dtype"]] + [_cell(r, key) for key, _ in _COLUMNS] for r in bench["rows"]]
    errors = [f"- {r['model']} {r['dtype']} (at {r['failed_at']}): {r['error']}" for r in bench["rows"] if r.get("error")]
    device = env.get("gpu") or env["device"]
    return "\n".join(
        [
            "# NEST on the device: tokens/s against the LM's own generate",
            "",
            f"- device: {device}; torch {env['torch']} (CUDA build: {env['torch_cuda'] or 'none'}), transformers {env['transformers']}",
            f"- {options['n']} biography items (+1 untimed warm-up), max_new_tokens {options['max_new_tokens']}, "
            f"index over {options['passages']} People summaries with keys precomputed on the device",
            f"- date: {bench['date']}; command: `{bench['command']}`",
            "",
            markdown_table(["model", "dtype"] + [header for _, header in _COLUMNS], rows),
            "",
            "Rates are generated tokens / summed wall seconds per contender (synchronised on CUDA); nest includes its "
            "retrieval. copied share: items whose nest text copied from the datastore; base = generate: items where "
            "NEST's base mode wrote the same text as `generate`.",
            *(["", "## Errors", "", *errors] if errors else []),
            "",
        ]
    )


def _write(out: Path, bench: Mapping[str, Any]) -> None:
    """Write both files (after every row, so a run cut short keeps what it finished)."""
    write_json(out / "device_bench.json", bench)
    (out / "device_bench.md").write_text(_markdown(bench), encoding="utf-8")


# --------------------------------------------------------------------------- the bench


def run_device_bench(
    models: Sequence[str] = ("default", "gemma-3-270m"),
    device: str = "cuda",
    dtypes: Sequence[str] = ("float16", "bfloat16"),
    n: int = 8,
    max_new_tokens: int = 96,
    passages: int = 300,
    out_dir: str | Path = Path("runs/device-bench"),
    seed: int = 0,
) -> dict[str, Any]:
    """Time ``generate``, base and nest for every model x dtype on ``device`` (see the module docstring).

    Args:
        models: LM names for :func:`~nest_integrations.model.lm.load_lm` (embedded names, folders, hub ids available offline).
        device: ``cpu``, ``cuda``, ``cuda:<i>`` or ``mps``.
        dtypes: some of :data:`DEVICE_BENCH_DTYPES`.
        n: timed biography items per row (one more runs untimed first).
        max_new_tokens: budget of every generation.
        passages: the first this many People summaries form the index.
        out_dir: folder for ``device_bench.json`` and ``device_bench.md`` (created).
        seed: sampling seed of the biography items (among the index's people).

    Returns:
        ``{"command", "date", "environment", "options", "rows"}``; a row has
        ``model``, ``dtype``, ``failed_at`` (None, ``"load"`` or ``"run"``) and
        ``error`` (``"Type: message"``) or, when it ran: ``load_s``, ``build_s``,
        ``calibration_s`` (seconds), ``precompute_tokens_per_s``, per contender
        ``generate``/``base``/``nest`` totals (``new_tokens``, ``wall_s``,
        ``tokens_per_s``; base and nest also ``forward_passes``,
        ``tokens_per_forward``, ``retrieval_s``, mean ``attribution_ratio``),
        ``nest_vs_generate``/``base_vs_generate``/``nest_vs_base`` (tokens/s
        ratios), ``copied_share``, ``base_equals_generate``, ``peak_gpu_mib``
        (CUDA) and ``peak_rss_mib``, ``run`` (run metadata) and ``items`` (per item).

    Raises:
        ValueError: before any model loads: no model, an unknown dtype, a device this
            process cannot use, ``n``/``max_new_tokens``/``passages`` below 1, or too few
            people among the passages for ``n + 1`` items.
    """
    if not models:
        raise ValueError("no model given")
    dtypes = check_dtypes(dtypes)
    check_device(device)
    for name, value in (("n", n), ("max_new_tokens", max_new_tokens), ("passages", passages)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    corpus = load_wikipedia_summaries(topic="People", limit=passages)
    items = bio_items(n + 1, seed, passages=corpus)  # the first is the warm-up
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bench: dict[str, Any] = {
        "command": shlex.join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": _environment(device),
        "options": {"models": list(models), "dtypes": list(dtypes), "n": n, "max_new_tokens": max_new_tokens,
                    "passages": len(corpus), "seed": seed},
        "rows": [],
    }
    for model in models:
        for dtype in dtypes:
            logger.info("device bench: %s %s on %s", model, dtype, device)
            bench["rows"].append(_bench_row(model, dtype, device, corpus, items, max_new_tokens))
            _release(device)
            _write(out, bench)
    logger.info("wrote the device bench to %s", out)
    return bench
