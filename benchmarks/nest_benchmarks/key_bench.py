"""Compressed token keys against float16 keys, on real decoding queries.

:func:`run_key_bench` measures, in one run over the same queries and the same
candidate tokens, every codec named (``nest bench keys``):

* queries: greedy answers to biography prompts drawn from the index's corpus,
  written by each of ``query_modes``: ``base``, the LM alone (text the corpus
  does not hold, so queries lie far from every candidate and the nearest is
  often a near tie: the hard case), and ``nest``, the decoder itself (the
  queries NEST issues while it writes and copies); each generated token's
  query is the key-layer hidden state it was predicted from (one
  teacher-forced forward);
* candidates: the tokens of the first-stage passages of that prompt (the
  decoder's ``passage_k``), encoded once as float16 and stored with each
  codec -- exactly the candidate set the decoder searches;
* per codec: stored bytes per token, top-1 neighbour agreement with float16
  (same entry), top-1 token agreement (the neighbours' value tokens agree:
  what the kNN distribution and span proposals start from), top-10 overlap, the RRC weight lambda's mean absolute change
  (default alpha and tau), the top-1 distance's error relative to the query's
  median distance to its ``token_k`` neighbours (every candidate when there are
  fewer; a scale that copying queries, whose nearest distance is near zero, do
  not blow up), search time
  per decoding step (one query, ``token_k`` neighbours), candidate-set build
  time from stored rows (once per generation) and codec training seconds.

Every codec is trained on the same sample of corpus keys. Timings of all
codecs alternate query by query, so load on a shared machine hits them alike;
speed ratios are within the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nest_integrations import NestDecoder, NestIndex
from nest_integrations.core.mixture import rrc_lambda
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.datastore import store_keys
from nest_integrations.store.encoder import EncodedPassage
from nest_integrations.store.codec_base import DEFAULT_TRAIN_KEYS, KeyCodec, sample_rows
from nest_integrations.store.key_codec import make_codec
from .runner import format_cell, load_items, markdown_table, ratio, run_config, run_metadata, write_json

__all__ = ["DEFAULT_BENCH_CODECS", "run_key_bench"]

logger = logging.getLogger(__name__)

DEFAULT_BENCH_CODECS: tuple[str, ...] = ("sq8", "pq48", "opq48", "pq72", "opq72", "pq96", "opq96", "pq144", "opq144")
OVERLAP_K = 10
"""Neighbours compared for the top-k overlap."""
QUERY_MODES: tuple[str, ...] = ("base", "nest")
"""Who writes the answers whose decoding states are the queries (see the module docstring)."""
TIMING_REPEATS = 3
"""Timed searches per query and codec (the fastest is kept)."""


def decoding_queries(decoder: NestDecoder, prompt: str, text: str) -> torch.Tensor:
    """float32 (T, d): the decoder's query vectors for the T tokens of ``text`` written after ``prompt``.

    Row ``t`` is the key-layer state at the position from which token ``t`` of
    ``text`` is predicted, as in decoding (one forward without a cache).
    """
    tokenizer = decoder.lm.tokenizer
    prompt_ids = tokenizer(decoder.format_prompt(prompt, decoder.config), add_special_tokens=False)["input_ids"]
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not text_ids:
        return torch.zeros((0, decoder.lm.hidden_size))
    ids = torch.tensor([prompt_ids + text_ids[:-1]], dtype=torch.long, device=decoder.lm.device)
    with torch.inference_mode(), decoder.lm.forward_lock, decoder.reader.capture() as captured:
        outputs = decoder.lm.model(input_ids=ids, use_cache=False, logits_to_keep=1, **decoder.reader.forward_kwargs())
        keys = decoder.reader.keys_from(captured, outputs)
    return keys[0, len(prompt_ids) - 1 :].float().cpu()


def _train_codecs(index: NestIndex, specs: Sequence[str], sample_passages: int, train_keys: int, seed: int) -> dict[str, tuple[KeyCodec, float]]:
    """Every codec trained on the same keys of ``sample_passages`` random passages: spec -> (codec, seconds)."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(index.passages), size=min(sample_passages, len(index.passages)), replace=False)
    encoded = index.datastore.encoder.encode([index.passages[i].text for i in sorted(chosen.tolist())])
    sample = sample_rows(np.concatenate([e.keys[e.valid] for e in encoded]), train_keys, seed=seed)
    logger.info("training %d codecs on %d keys of %d passages", len(specs), len(sample), len(chosen))
    trained = {}
    for spec in specs:
        codec = make_codec(spec, index.datastore.hidden_size)
        start = time.perf_counter()
        codec.train(sample)
        trained[spec] = (codec, time.perf_counter() - start)
    return trained


def _fastest_search_s(candidates: CandidateSet, query: torch.Tensor, k: int) -> float:
    best = float("inf")
    for _ in range(TIMING_REPEATS):
        start = time.perf_counter()
        candidates.search(query, k)
        best = min(best, time.perf_counter() - start)
    return best


def _compare(reference: Any, approx: Any, k_overlap: int, alpha: float, tau: float) -> dict[str, np.ndarray]:
    """Per-query agreement of two :class:`Neighbours` over the same entries."""
    top1 = (approx.entries[:, 0] == reference.entries[:, 0]).numpy()
    top1_value = (approx.values[:, 0] == reference.values[:, 0]).numpy()
    ref_k, app_k = reference.entries[:, :k_overlap].numpy(), approx.entries[:, :k_overlap].numpy()
    overlap = np.asarray([len(set(a) & set(b)) / max(len(a), 1) for a, b in zip(ref_k, app_k)])
    lam_diff = (rrc_lambda(approx.scores, alpha, tau) - rrc_lambda(reference.scores, alpha, tau)).abs().numpy()
    ref_d, app_d = -reference.scores[:, 0].numpy(), -approx.scores[:, 0].numpy()
    median_d = np.maximum(-reference.scores.median(dim=1).values.numpy(), 1e-6)
    return {"top1": top1, "top1_value": top1_value, "overlap": overlap, "lambda_diff": lam_diff, "distance_err": np.abs(app_d - ref_d) / median_d}


def run_key_bench(
    index: NestIndex,
    *,
    codecs: Sequence[str] = DEFAULT_BENCH_CODECS,
    n: int = 12,
    seed: int = 0,
    max_new_tokens: int = 64,
    sample_passages: int = 384,
    train_keys: int = DEFAULT_TRAIN_KEYS,
    query_modes: Sequence[str] = QUERY_MODES,
    out_dir: str | Path,
) -> dict[str, Any]:
    """Compare key codecs with float16 keys on the decoding queries of ``n`` biography prompts.

    Args:
        index: the NEST index (its LM, encoder, first stage and corpus).
        codecs: codec names (:func:`~nest_integrations.store.key_codec.make_codec`);
            float16 is always the reference row.
        n: biography prompts (seeded draw from the corpus).
        max_new_tokens: tokens the LM writes per prompt (queries per prompt).
        sample_passages: corpus passages encoded for the shared training sample.
        train_keys: training keys drawn from them.
        query_modes: decoding modes whose answers give the queries (``base``, ``nest``; see the module docstring).
        out_dir: folder for ``key_bench.json`` and ``key_bench.md``.

    Returns:
        The report written to ``key_bench.json``: ``rows`` (one per query mode
        and codec, float16 first) and the run's settings.
    """
    if index.datastore.codec.compresses:
        raise ValueError("the key bench needs float16 reference keys: use an index built without --key-compression")
    unknown = sorted(set(query_modes) - set(QUERY_MODES))
    if unknown or not query_modes:
        raise ValueError(f"query modes must be some of {', '.join(QUERY_MODES)}; got {', '.join(query_modes) or 'none'}")
    specs = [s for s in dict.fromkeys(codecs) if s not in ("float16", "none")]
    query_modes = list(dict.fromkeys(query_modes))
    config = run_config(None, max_new_tokens)
    items = load_items("bio", n, seed=seed, passages=index.passages)
    trained = _train_codecs(index, specs, sample_passages, train_keys, seed)
    decoders = {mode: index.decoder(config.updated(mode=mode)) for mode in query_modes}
    all_codecs = {"float16": (index.datastore.codec, 0.0), **trained}
    per_codec: dict[str, dict[str, list[Any]]] = {spec: {"search_s": [], "build_s": [], "entries": []} for spec in all_codecs}
    agreement: dict[tuple[str, str], dict[str, list[Any]]] = {(mode, spec): {} for mode in query_modes for spec in all_codecs}
    queries_total = dict.fromkeys(query_modes, 0)
    first = next(iter(decoders.values()))
    first.ensure_calibration(config.updated(mode="nest"))  # the alpha/tau nest decodes with
    alpha, tau = first.rrc_parameters(config)
    for item in items:
        passages = [p for p, _ in index.retrieve(item.query, config.passage_k)]
        indices = [index.datastore.add(p) for p in passages]
        float16_passages: list[EncodedPassage] = index.datastore.fetch(indices)
        queries_of = {}
        for mode, decoder in decoders.items():
            text = decoder.generate(item.prompt, query=item.query).text
            queries_of[mode] = decoding_queries(decoder, item.prompt, text)
            queries_total[mode] += len(queries_of[mode])
        queries = torch.cat(list(queries_of.values()))
        if not len(queries):
            continue
        sets = {}
        for spec, (codec, _) in all_codecs.items():
            stored = [store_keys(e, codec) for e in float16_passages]  # as precomputed: not timed
            start = time.perf_counter()
            sets[spec] = CandidateSet(indices, stored, codec=codec)
            per_codec[spec]["build_s"].append(time.perf_counter() - start)
            per_codec[spec]["entries"].append(len(sets[spec]))
        for mode, mode_queries in queries_of.items():
            if not len(mode_queries):
                continue
            reference = sets["float16"].search(mode_queries, config.token_k)
            for spec, candidates in sets.items():
                found = candidates.search(mode_queries, config.token_k)
                for name, values in _compare(reference, found, OVERLAP_K, alpha, tau).items():
                    agreement[(mode, spec)].setdefault(name, []).extend(values.tolist())
        for t in range(len(queries)):  # codecs alternate query by query
            for spec, candidates in sets.items():
                per_codec[spec]["search_s"].append(_fastest_search_s(candidates, queries[t : t + 1], config.token_k))
    float16_search = float(np.mean(per_codec["float16"]["search_s"]))
    rows = []
    for (mode, spec), m in agreement.items():
        if not m:
            continue
        codec, train_s = all_codecs[spec]
        search_ms = float(np.mean(per_codec[spec]["search_s"])) * 1e3
        rows.append(
            {
                "queries": mode,
                "codec": spec,
                "bytes_per_token": codec.bytes_per_key,
                "compression_vs_float16": ratio(2.0 * codec.dim, codec.bytes_per_key),
                "top1_agreement": float(np.mean(m["top1"])),
                "top1_token_agreement": float(np.mean(m["top1_value"])),
                f"top{OVERLAP_K}_overlap": float(np.mean(m["overlap"])),
                "lambda_abs_diff_mean": float(np.mean(m["lambda_diff"])),
                "lambda_abs_diff_max": float(np.max(m["lambda_diff"])),
                "top1_distance_err_of_median": float(np.mean(m["distance_err"])),
                "search_ms_per_step": search_ms,
                "search_speed_vs_float16": ratio(float16_search * 1e3, search_ms),
                "candidate_build_ms": float(np.mean(per_codec[spec]["build_s"])) * 1e3,
                "train_s": train_s,
            }
        )
    report = {
        **run_metadata(index, config),
        "items": len(items),
        "seed": seed,
        "queries": queries_total,
        "mean_candidate_entries": float(np.mean(per_codec["float16"]["entries"])),
        "token_k": config.token_k,
        "train": {"sample_passages": sample_passages, "train_keys": train_keys},
        "rows": rows,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "key_bench.json", report)
    (out / "key_bench.md").write_text(_markdown(report), encoding="utf-8")
    return report


_COLUMNS = (
    ("queries", "queries"),
    ("codec", "codec"),
    ("bytes_per_token", "B/token"),
    ("compression_vs_float16", "x smaller"),
    ("top1_agreement", "top-1 agreement"),
    ("top1_token_agreement", "top-1 token agreement"),
    (f"top{OVERLAP_K}_overlap", f"top-{OVERLAP_K} overlap"),
    ("lambda_abs_diff_mean", "mean abs lambda change"),
    ("top1_distance_err_of_median", "top-1 distance err / median"),
    ("search_ms_per_step", "search ms/step"),
    ("search_speed_vs_float16", "search speed vs float16"),
    ("candidate_build_ms", "candidate set ms"),
    ("train_s", "train s"),
)


def _markdown(report: dict[str, Any]) -> str:
    table = markdown_table([h for _, h in _COLUMNS], [[format_cell(row[key]) for key, _ in _COLUMNS] for row in report["rows"]])
    return (
        f"# Key codecs vs float16 ({report['items']} biography prompts, decoding queries: "
        f"{', '.join(f'{count} from {mode} answers' for mode, count in report['queries'].items())}, "
        f"{report['mean_candidate_entries']:.0f} candidate tokens per prompt on average)\n\n"
        f"`{report['command']}` ({report['date']})\n\n{table}\n"
    )
