"""Speed benchmark and hyperparameter sweep of the NEST decoder.

:func:`run_bench` measures, in one process and one run, on the same
chat-formatted prompts (what is compared is recorded in ``bench.json``):

* modes: every decoding mode over **precomputed keys** (the index's own when
  it has them, else the passages first-stage retrieval returns for the bench
  prompts, precomputed into a side datastore before timing), so the mode
  comparison is not blurred by lazy encoding. Per mode: tokens/s, tokens per
  forward pass (prefill included), the time split (retrieval incl. relevance
  gate, encoding, decoding, other = formatting and detokenisation), time to
  first streamed text, the wall-time speedup vs Hugging Face
  ``model.generate`` (same token counts) and the tokens/s speedup vs base
  (base writes the full budget while nest may stop where its source ends);
* Hugging Face greedy ``generate`` on the same prompt ids, forced to produce
  exactly the number of tokens each mode produced for that prompt
  (``min_new_tokens = max_new_tokens = count``), timed on that count;
* keys: nest with a fresh lazy datastore per prompt, no key cached (every retrieved
  passage encoded inside the generation: cold cache) vs nest over the
  precomputed keys;
* datastore build: ``TokenDatastore.precompute`` tokens/s on a passage subset
  next to a plain forward of the same LM over the very same padded batches
  (recorded during the precompute and replayed), both per passage token;
  the goal is a ratio >= 0.9;
* batching: the LM alone, every prompt in one left-padded HF ``generate``
  batch vs one prompt at a time (NEST's own batched decoding, concurrent
  callers and the lossless peers are measured by ``nest bench batching``,
  :mod:`~nest_benchmarks.throughput`);
* memory: peak resident set size and bytes per stored key and per entry.

All runs of one prompt (modes, lazy, precomputed, HF) run back to back, so load
drift on a shared machine hits every contender alike.

:func:`run_sweep` records quality and speed of nest for several values of one
hyperparameter and plots the trade-off.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from nest_integrations import GenerationStats, LoadedLM, NestDecoder, NestIndex, Passage
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.key_precision import encoding_model
from nest_integrations.store.key_sources import PrecomputedKeys
from .metrics import aggregate, tokens_per_forward
from .runner import (
    check_modes,
    decoder_over,
    evaluate_item,
    first_stage,
    format_cell,
    fresh_lazy_datastore,
    load_items,
    markdown_table,
    ratio,
    run_config,
    run_metadata,
    warm_up,
    write_json,
)

__all__ = [
    "BENCH_MODES",
    "SWEEP_PARAMS",
    "hf_generate",
    "peak_rss_mib",
    "precomputed_datastore",
    "prompt_ids",
    "run_bench",
    "run_sweep",
]

logger = logging.getLogger(__name__)

BENCH_MODES: tuple[str, ...] = ("base", "knnlm", "nest", "ra_nest")
SWEEP_PARAMS: tuple[str, ...] = ("gamma", "delta", "alpha")
BUILD_RATIO_GOAL = 0.9
"""Target of precompute tokens/s divided by raw batched-forward tokens/s."""

Request = tuple[str, str]
"""A bench prompt and its first-stage retrieval query."""


# --------------------------------------------------------------------------- requests and keys


def _requests(index: NestIndex, prompts: Sequence[str] | None, n: int, seed: int) -> list[Request]:
    """``(prompt, query)`` pairs: the given prompts (query = prompt), else ``n``
    biography prompts from the index's corpus (query = the person's name).

    Raises:
        ValueError: an empty ``prompts`` list, or ``n`` bio items unavailable.
    """
    if prompts is not None:
        if not prompts:
            raise ValueError("prompts is empty")
        return [(p, p) for p in prompts]
    return [(item.prompt, item.query) for item in load_items("bio", n, seed=seed, passages=index.passages)]


def precomputed_datastore(index: NestIndex, requests: Sequence[Request], k: int) -> tuple[TokenDatastore, str]:
    """A datastore whose keys for the requests' passages are precomputed, and what it holds.

    The index's datastore when its keys are precomputed; else a side datastore
    over the union of the top-``k`` first-stage passages of every request,
    precomputed now (untimed).
    """
    if index.datastore.is_precomputed:
        return index.datastore, f"index precomputed keys ({len(index.passages)} passages)"
    passages: dict[str, Passage] = {}
    for _, query in requests:
        passages.update((p.id, p) for p, _ in index.retrieve(query, k))
    datastore = TokenDatastore(list(passages.values()), index.datastore.encoder)
    datastore.precompute(show_progress=False)
    return datastore, f"retrieved passages precomputed before timing ({len(passages)} passages)"


# --------------------------------------------------------------------------- timed runs


def _stream_run(decoder: NestDecoder, request: Request, mode: str) -> dict[str, Any]:
    """One streamed generation: ``{"ttft_s": seconds to the first text chunk or
    None, "output": NestOutput dict}``."""
    prompt, query = request
    output = None
    ttft = None
    start = time.perf_counter()
    for chunk in decoder.stream(prompt, query=query, mode=mode):
        if ttft is None and chunk.text:
            ttft = time.perf_counter() - start
        output = chunk.output
    assert output is not None  # the last chunk always carries it
    return {"ttft_s": ttft, "output": output.to_dict()}


def _summarize_runs(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals and rates over streamed runs.

    Returns:
        ``new_tokens``, ``forward_passes``, ``wall_s`` and the split
        ``retrieval_s``/``encode_s``/``decode_s``/``other_s`` (sums, seconds),
        ``encoded_passages``, ``tokens_per_s`` (total tokens / total wall),
        ``tokens_per_forward`` (total tokens / total forwards), and means of
        ``ttft_s``, ``attribution_ratio`` and ``mean_copied_span_tokens``.
    """
    stats = [run["output"]["stats"] for run in runs]
    totals = {
        key: math.fsum(s[key] for s in stats)
        for key in ("wall_s", "retrieval_s", "encode_s", "decode_s")
    }
    tokens = sum(s["new_tokens"] for s in stats)
    forwards = sum(s["forward_passes"] for s in stats)
    means = aggregate(
        [
            {
                "ttft_s": run["ttft_s"],
                "attribution_ratio": run["output"]["attribution_ratio"],
                "mean_copied_span_tokens": run["output"]["mean_copied_span_tokens"],
            }
            for run in runs
        ],
        ("ttft_s", "attribution_ratio", "mean_copied_span_tokens"),
    )
    return {
        "prompts": len(runs),
        "new_tokens": tokens,
        "forward_passes": forwards,
        **totals,
        "other_s": totals["wall_s"] - totals["retrieval_s"] - totals["encode_s"] - totals["decode_s"],
        "encoded_passages": sum(s["encoded_passages"] for s in stats),
        "tokens_per_s": ratio(tokens, totals["wall_s"]),
        "tokens_per_forward": (
            tokens_per_forward({"new_tokens": tokens, "forward_passes": forwards}, len(runs)) if forwards else None
        ),
        "ttft_s": means["ttft_s"],
        "attribution_ratio": means["attribution_ratio"],
        "mean_copied_span_tokens": means["mean_copied_span_tokens"],
    }


def hf_generate(
    lm: LoadedLM,
    batch: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    stop_ids: Collection[int] = (),
    **generate_kwargs: Any,
) -> tuple[float, list[list[int]]]:
    """One greedy Hugging Face ``generate`` over ``batch`` (prompt ids, left-padded into one batch).

    Args:
        lm: the loaded LM.
        batch: one list of prompt token ids per row (ints; rows may differ in length).
        max_new_tokens: budget per row.
        stop_ids: token ids that end a row (EOS); a row's tokens are cut before the
            first of them, so the padding ``generate`` appends to a row that finished
            before the others is cut too.
        **generate_kwargs: passed to ``generate`` (e.g. ``min_new_tokens``,
            ``prompt_lookup_num_tokens``).

    Returns:
        Wall seconds of the ``generate`` call alone (padding and decoding excluded)
        and the new token ids of each row.
    """
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.tokenizer.eos_token_id
    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in batch], dtype=torch.long, device=lm.device)
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=lm.device)
    with torch.inference_mode():
        start = time.perf_counter()
        out = lm.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **generate_kwargs,
        )
        seconds = time.perf_counter() - start
    ends = set(stop_ids)
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i for i, token in enumerate(row) if token in ends), len(row))
        rows.append(row[:cut])
    return seconds, rows


def _hf_generate_seconds(lm: LoadedLM, batch: Sequence[Sequence[int]], count: int) -> float:
    """Seconds of one greedy Hugging Face ``generate`` over ``batch`` (prompt ids,
    left-padded into one batch), every row producing exactly ``count`` tokens.

    Raises:
        RuntimeError: if ``generate`` returned another number of tokens.
    """
    if count == 0:
        return 0.0
    seconds, rows = hf_generate(lm, batch, count, min_new_tokens=count)
    produced = {len(row) for row in rows}
    if produced != {count}:
        raise RuntimeError(f"Hugging Face generate produced {sorted(produced)} tokens instead of {count}")
    return seconds


def _batching(lm: LoadedLM, prompt_ids: Sequence[Sequence[int]], count: int) -> dict[str, Any]:
    """The LM alone (HF greedy ``generate``, ``count`` tokens per prompt): every
    prompt in one left-padded batch vs one prompt at a time.

    Returns:
        ``prompts``, ``new_tokens``, ``sequential_s``, ``batch_s`` (seconds) and
        ``batch_speedup`` = sequential / batch.
    """
    sequential = math.fsum(_hf_generate_seconds(lm, [ids], count) for ids in prompt_ids)
    batched = _hf_generate_seconds(lm, prompt_ids, count)
    return {
        "prompts": len(prompt_ids),
        "new_tokens": count * len(prompt_ids),
        "sequential_s": sequential,
        "batch_s": batched,
        "batch_speedup": ratio(sequential, batched),
    }


def prompt_ids(decoder: NestDecoder, prompt: str, mode: str = "base", context: Sequence[Passage] = ()) -> list[int]:
    """The token ids the decoder feeds for ``prompt`` in ``mode`` (chat template applied),
    with ``context`` passages in the prompt as the rag modes put them."""
    config = decoder.config.updated(mode=mode)
    return decoder.encode_prompt(decoder.format_prompt(prompt, config, context), config, GenerationStats())


def _time_prompt(
    index: NestIndex, decoder: NestDecoder, request: Request, prompt_ids: Sequence[int], modes: Sequence[str]
) -> dict[str, Any]:
    """Every timed run of one prompt, back to back, so that load drift on a shared
    machine hits all contenders alike: each mode, nest over a fresh lazy datastore,
    nest over the precomputed keys, then HF ``generate`` once per distinct token
    count the modes produced.

    Returns:
        ``{"modes": {mode: run}, "keys": {"lazy": run, "precomputed": run},
        "hf": {count: seconds}}`` (runs as in :func:`_stream_run`).
    """
    runs = {mode: _stream_run(decoder, request, mode) for mode in modes}
    lazy_decoder = decoder_over(index, fresh_lazy_datastore(index), decoder.config)
    keys = {"lazy": _stream_run(lazy_decoder, request, "nest"), "precomputed": _stream_run(decoder, request, "nest")}
    counts = sorted({run["output"]["stats"]["new_tokens"] for run in runs.values()})
    return {"modes": runs, "keys": keys, "hf": {c: _hf_generate_seconds(decoder.lm, [prompt_ids], c) for c in counts}}


def _hf_seconds_for(timings: Sequence[Mapping[str, Any]], mode: str) -> float:
    """HF generate seconds for the same prompts and token counts as ``mode``'s runs."""
    return math.fsum(t["hf"][t["modes"][mode]["output"]["stats"]["new_tokens"]] for t in timings)


def _hf_summary(timings: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """HF generate totals over every timed (prompt, count): runs, new_tokens, wall_s, tokens_per_s."""
    tokens = sum(count for t in timings for count in t["hf"])
    wall = math.fsum(seconds for t in timings for seconds in t["hf"].values())
    return {
        "runs": sum(len(t["hf"]) for t in timings),
        "new_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": ratio(tokens, wall),
    }


# --------------------------------------------------------------------------- datastore build


def _datastore_build(index: NestIndex, passages: Sequence[Passage]) -> tuple[dict[str, Any], PrecomputedKeys]:
    """``precompute`` throughput vs a raw forward over the same padded batches.

    A forward pre-hook records every batch the precompute feeds the LM; the
    batches are then replayed as plain forwards (same arguments, no key
    capture, no post-processing) and timed. Both rates are passage tokens
    (prefix and padding excluded) per second.

    Returns:
        The section (passages, tokens, batches, both rates, ratio, goal,
        meets_goal) and the precomputed keys.
    """
    encoder = index.datastore.encoder
    model, _ = encoding_model(index.lm, encoder.reader)  # the model precompute runs (a bfloat16 copy on some CPUs)
    encoder.encode([passages[0].text])  # untimed warm-up
    datastore = TokenDatastore(passages, encoder)
    batches: list[dict[str, Any]] = []
    handle = model.register_forward_pre_hook(lambda _m, _a, kwargs: batches.append(dict(kwargs)), with_kwargs=True)
    try:
        precompute_rate = datastore.precompute(show_progress=False)
    finally:
        handle.remove()
    keys = datastore.precomputed
    assert keys is not None  # set by precompute
    tokens = len(keys.token_ids)
    with torch.inference_mode():
        start = time.perf_counter()
        for kwargs in batches:
            model(**kwargs)
        raw_s = time.perf_counter() - start
    raw_rate = tokens / max(raw_s, 1e-9)
    build = {
        "passages": len(passages),
        "tokens": tokens,
        "batches": len(batches),
        "precompute_tokens_per_s": precompute_rate,
        "raw_forward_tokens_per_s": raw_rate,
        "ratio": precompute_rate / raw_rate,
        "goal": BUILD_RATIO_GOAL,
        "meets_goal": precompute_rate / raw_rate >= BUILD_RATIO_GOAL,
    }
    return build, keys


def peak_rss_mib() -> float | None:
    """The peak resident set size of this process so far, in MiB (None where
    ``resource`` is unavailable, i.e. not on Unix)."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def _memory(keys: PrecomputedKeys) -> dict[str, Any]:
    """Peak RSS of this process (MiB; None where ``resource`` is unavailable) and
    storage per key (float16 key row) and per datastore entry (all arrays / entries)."""
    peak_mib = peak_rss_mib()
    arrays = (keys.token_ids, keys.char_spans, keys.keys, keys.valid, keys.offsets)
    entries = int(keys.valid.sum())
    return {
        "peak_rss_mib": peak_mib,
        "bytes_per_key": keys.keys.nbytes / max(len(keys.keys), 1),
        "bytes_per_entry": ratio(float(sum(a.nbytes for a in arrays)), entries),
        "key_dtype": str(keys.keys.dtype),
    }


# --------------------------------------------------------------------------- report


_MODE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("new_tokens", "tokens"),
    ("tokens_per_s", "tok/s"),
    ("tokens_per_forward", "tok/fwd"),
    ("ttft_s", "TTFT s"),
    ("retrieval_s", "retrieval s"),
    ("encode_s", "encode s"),
    ("decode_s", "decode s"),
    ("other_s", "other s"),
    ("wall_s", "wall s"),
    ("speedup_vs_hf", "speedup vs HF"),
    ("speedup_vs_base", "speedup vs base"),
    ("attribution_ratio", "attribution"),
)
_KEYS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("wall_s", "wall s"),
    ("encode_s", "encode s"),
    ("encoded_passages", "encoded passages"),
    ("tokens_per_s", "tok/s"),
    ("ttft_s", "TTFT s"),
)


def _bench_markdown(bench: Mapping[str, Any]) -> str:
    """``bench.md``: the mode table, HF, keys, build throughput and memory."""
    mode_rows = [[mode] + [m[key] for key, _ in _MODE_COLUMNS] for mode, m in bench["modes"].items()]
    keys = bench["keys"]
    key_rows = [[name] + [keys[name][key] for key, _ in _KEYS_COLUMNS] for name in ("lazy", "precomputed")]
    hf, build, memory = bench["hf_generate"], bench["datastore_build"], bench["memory"]
    batching, max_new = bench["batching"], bench["max_new_tokens"]
    return "\n".join(
        [
            "# NEST speed benchmark",
            "",
            f"- model: {bench['model']}; prompts: {len(bench['prompts'])}; max_new_tokens: {bench['max_new_tokens']}",
            f"- keys for the mode table: {bench['precomputed_source']}",
            f"- date: {bench['date']}; command: `{bench['command']}`",
            "",
            "## Modes",
            "",
            markdown_table(["mode"] + [header for _, header in _MODE_COLUMNS], mode_rows),
            "",
            "Times are sums over the prompts; speedup vs HF = HF wall time for the same token counts / mode wall time, "
            "speedup vs base = mode tokens/s / base tokens/s (> 1: faster).",
            "",
            f"HF `generate` (greedy, same prompts, same token counts): {hf['new_tokens']} tokens in "
            f"{format_cell(hf['wall_s'])} s = {format_cell(hf['tokens_per_s'])} tok/s over {hf['runs']} runs.",
            "",
            "## Lazy vs precomputed keys (nest)",
            "",
            markdown_table(["keys"] + [header for _, header in _KEYS_COLUMNS], key_rows),
            "",
            f"Precomputed speedup over lazy: {format_cell(keys['speedup_precomputed_vs_lazy'])}",
            "",
            "## Batching (the LM alone)",
            "",
            f"HF greedy `generate`, {batching['prompts']} prompts x {max_new} tokens: one left-padded batch "
            f"{format_cell(batching['batch_s'])} s vs one prompt at a time {format_cell(batching['sequential_s'])} s "
            f"(batch speedup {format_cell(batching['batch_speedup'])}).",
            "",
            "## Datastore build",
            "",
            f"`precompute` {format_cell(build['precompute_tokens_per_s'])} tok/s vs raw batched forward "
            f"{format_cell(build['raw_forward_tokens_per_s'])} tok/s on {build['passages']} passages "
            f"({build['tokens']} tokens, {build['batches']} batches): ratio {format_cell(build['ratio'])} "
            f"(goal >= {build['goal']}: {format_cell(build['meets_goal'])}).",
            "",
            "## Memory",
            "",
            f"Peak RSS {format_cell(memory['peak_rss_mib'])} MiB; {format_cell(memory['bytes_per_key'])} bytes per "
            f"stored key ({memory['key_dtype']}), {format_cell(memory['bytes_per_entry'])} bytes per datastore entry "
            "(keys, tokens, char spans, flags, offsets).",
            "",
        ]
    )


# --------------------------------------------------------------------------- the bench


def run_bench(
    index: NestIndex,
    *,
    prompts: Sequence[str] | None = None,
    n: int = 4,
    seed: int = 0,
    max_new_tokens: int = 64,
    modes: Sequence[str] = BENCH_MODES,
    out_dir: str | Path,
    build_passages: int = 64,
    config_overrides: Mapping[str, Any] | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Benchmark decoding speed, key storage and datastore build (see the module docstring).

    Args:
        index: the NEST index.
        prompts: chat prompts (each also its retrieval query); None draws ``n``
            biography prompts from the index's corpus with ``seed``.
        max_new_tokens: generation budget per prompt.
        modes: decoding modes to time.
        out_dir: folder for ``bench.json`` and ``bench.md`` (created if needed).
        build_passages: size of the passage subset (the corpus's first ones)
            for the datastore build measurement.
        config_overrides: :class:`NestConfig` fields (not mode,
            max_new_tokens, use_chat_template).
        show_progress: tqdm bar over the prompts.

    Returns:
        The benchmark (as written to ``bench.json``): run metadata, prompts,
        ``modes`` (per mode: :func:`_summarize_runs` plus ``hf_wall_s``,
        ``speedup_vs_hf`` = HF seconds / mode seconds for the same counts and
        ``speedup_vs_base`` = mode tokens/s / base tokens/s), ``hf_generate``,
        ``keys`` (``lazy``, ``precomputed``, ``speedup_precomputed_vs_lazy``),
        ``batching`` (:func:`_batching`), ``datastore_build`` and ``memory``.

    Raises:
        ValueError: invalid modes, prompts, n, build_passages or overrides.
    """
    modes = check_modes(modes)
    if build_passages < 1:
        raise ValueError(f"build_passages must be >= 1, got {build_passages}")
    config = run_config(config_overrides, max_new_tokens)
    requests = _requests(index, prompts, n, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    datastore, precomputed_source = precomputed_datastore(index, requests, config.passage_k)
    decoder = decoder_over(index, datastore, config)
    ids_per_prompt = [prompt_ids(decoder, prompt) for prompt, _ in requests]
    warm_decoder = decoder_over(index, fresh_lazy_datastore(index), config.updated(max_new_tokens=2))
    _stream_run(warm_decoder, requests[0], "nest")  # untimed warm-ups
    _hf_generate_seconds(index.lm, [ids_per_prompt[0]], 2)
    bar = tqdm(requests, desc="bench", unit="prompt", disable=not show_progress)
    timings = [_time_prompt(index, decoder, request, ids, modes) for request, ids in zip(bar, ids_per_prompt)]

    mode_rows = {mode: _summarize_runs([t["modes"][mode] for t in timings]) for mode in modes}
    base_rate = mode_rows["base"]["tokens_per_s"] if "base" in mode_rows else None
    for mode, row in mode_rows.items():
        row["hf_wall_s"] = _hf_seconds_for(timings, mode)
        row["speedup_vs_hf"] = ratio(row["hf_wall_s"], row["wall_s"])
        row["speedup_vs_base"] = ratio(row["tokens_per_s"], base_rate)
    keys = {name: _summarize_runs([t["keys"][name] for t in timings]) for name in ("lazy", "precomputed")}
    keys["speedup_precomputed_vs_lazy"] = ratio(keys["lazy"]["wall_s"], keys["precomputed"]["wall_s"])
    batching = _batching(index.lm, ids_per_prompt, max_new_tokens)
    build, build_keys = _datastore_build(index, index.passages[:build_passages])

    bench = {
        **run_metadata(index, config),
        "prompts": [prompt for prompt, _ in requests],
        "queries": [query for _, query in requests],
        "max_new_tokens": max_new_tokens,
        "precomputed_source": precomputed_source,
        "modes": mode_rows,
        "hf_generate": _hf_summary(timings),
        "keys": keys,
        "batching": batching,
        "datastore_build": build,
        "memory": _memory(build_keys),
    }
    write_json(out / "bench.json", bench)
    (out / "bench.md").write_text(_bench_markdown(bench), encoding="utf-8")
    logger.info("wrote the benchmark to %s", out)
    return bench


# --------------------------------------------------------------------------- the sweep


def _plot_sweep(rows: Sequence[Mapping[str, Any]], param: str, path: Path) -> None:
    """Save the quality/speed trade-off: ROUGE-1 vs decode tokens/s (points
    labelled with the value) and attribution / tokens per forward vs the value."""
    from matplotlib.figure import Figure  # Agg canvas, no pyplot state

    figure = Figure(figsize=(10, 4), layout="constrained")
    trade_off, by_value = figure.subplots(1, 2)
    points = [r for r in rows if r["decode_tokens_per_s"] is not None and r["rouge1"] is not None]
    trade_off.plot([r["decode_tokens_per_s"] for r in points], [r["rouge1"] for r in points], "o-")
    for r in points:
        trade_off.annotate(f"{param}={r['value']:g}", (r["decode_tokens_per_s"], r["rouge1"]),
                           textcoords="offset points", xytext=(4, 4), fontsize=8)
    trade_off.set(xlabel="decode tokens / s", ylabel="ROUGE-1 vs gold", title="quality vs speed")
    values = [r["value"] for r in rows]
    by_value.plot(values, [r["attribution_ratio"] for r in rows], "o-", label="attribution ratio")
    by_value.set(xlabel=param, ylabel="attribution ratio", title=f"effect of {param}")
    if param == "gamma" and min(values) > 0:
        by_value.set_xscale("log")
    per_forward = by_value.twinx()
    per_forward.plot(
        values, [r["tokens_per_forward"] for r in rows], "s--", color="tab:orange", label="tokens / forward"
    )
    per_forward.set_ylabel("tokens / forward")
    figure.legend(loc="outside lower center", ncols=2)
    figure.savefig(path, dpi=120)


def run_sweep(
    index: NestIndex,
    *,
    param: str,
    values: Sequence[float],
    n: int,
    out_dir: str | Path,
    seed: int = 0,
    mode: str = "nest",
    max_new_tokens: int = 64,
    config_overrides: Mapping[str, Any] | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Quality and speed of ``mode`` on ``n`` biography items for each value of ``param``.

    Every value runs on the same items and first-stage hits (present
    condition, timed as in :func:`~nest_benchmarks.runner.run_eval`).

    Args:
        param: ``"gamma"``, ``"delta"`` or ``"alpha"``.
        values: the values to try (validated by :class:`NestConfig`).
        n: number of biography items from the index's corpus.
        out_dir: folder for ``sweep.json`` and ``sweep.png``.
        mode: ``"nest"`` or ``"ra_nest"`` (ra_nest reads ``ra_gamma``, so it
            cannot sweep ``gamma``).

    Returns:
        ``{"param", "mode", "values", ..., "rows": [...]}``; each row has the
        value, means of ROUGE-1/ROUGE-L vs gold, attribution ratio, mean copied
        span, tokens per forward, wall_s and decode_s, plus ``tokens_per_s``
        (mean new tokens / mean wall_s) and ``decode_tokens_per_s`` (/ mean decode_s).

    Raises:
        ValueError: unknown param or mode, empty values, gamma with ra_nest,
            invalid values or overrides.
    """
    if param not in SWEEP_PARAMS:
        raise ValueError(f"param must be one of {SWEEP_PARAMS}, got {param!r}")
    if mode not in ("nest", "ra_nest"):
        raise ValueError(f"sweeps run nest or ra_nest, got {mode!r}")
    if mode == "ra_nest" and param == "gamma":
        raise ValueError("ra_nest uses ra_gamma, not gamma: sweep gamma with mode='nest'")
    if not values:
        raise ValueError("values is empty")
    config = run_config(config_overrides, max_new_tokens)
    configs = [config.updated(**{param: value}) for value in values]  # validates every value up front
    items = load_items("bio", n, seed=seed, passages=index.passages)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    passages_by_id = {p.id: p.text for p in index.passages}
    warm_up(index, config, items[0])
    retrieved = {item.id: first_stage(index, item, "present", config.passage_k) for item in items}

    keys = ("rouge1", "rougeL", "attribution_ratio", "mean_copied_span_tokens", "tokens_per_forward",
            "new_tokens", "wall_s", "decode_s")
    rows = []
    with tqdm(total=len(values) * len(items), desc=f"sweep {param}", unit="gen", disable=not show_progress) as bar:
        for value, value_config in zip(values, configs):
            metrics = []
            for item in items:
                hits, first_stage_s = retrieved[item.id]
                metrics.append(
                    evaluate_item(index, value_config, item, "bio", mode, hits, first_stage_s, passages_by_id)[1]
                )
                bar.update()
            means = aggregate(metrics, keys)
            rows.append(
                {
                    "value": value,
                    **means,
                    "tokens_per_s": ratio(means["new_tokens"], means["wall_s"]),
                    "decode_tokens_per_s": ratio(means["new_tokens"], means["decode_s"]),
                }
            )
    sweep = {
        **run_metadata(index, config),
        "param": param,
        "mode": mode,
        "values": list(values),
        "item_ids": [item.id for item in items],
        "rows": rows,
    }
    write_json(out / "sweep.json", sweep)
    _plot_sweep(rows, param, out / "sweep.png")
    logger.info("wrote the %s sweep to %s", param, out)
    return sweep
