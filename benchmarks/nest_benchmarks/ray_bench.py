"""What Ray costs and gives, in one run: the index build and batch generation, Ray vs one process.

:func:`run_ray_bench` times on the same corpus and the same items:

* build: :meth:`NestIndex.build` with precomputed keys then ``save`` in this
  process (the LM already loaded; its load is timed apart), against :func:`~nest_integrations.index.distributed.build_index_on_ray`
  (start-up of the Ray runtime timed apart from the build, which includes
  starting the actors and loading one LM and embedder on each); plus how far
  the two builds agree (tokens, largest key difference, top-5 retrieval);
* generation: the same items through :func:`~nest_integrations.index.jobs.run_job`,
  in process (the batched decoder) and on Ray actors (each loading the index),
  with the outputs compared.

Writes ``ray.json`` and ``ray.md`` to ``out_dir``. Both contenders run back to
back in one process, so load from other jobs on a shared machine hits both.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from nest_integrations import NestIndex, load_lm, load_wikipedia_summaries
from nest_integrations.core.jsonl import iter_jsonl
from nest_integrations.index.distributed import build_index_on_ray, ray_cluster, ray_generator
from nest_integrations.index.jobs import JobItem, in_process_runner, job_settings, read_items, run_job
from nest_integrations.index.nest_index import index_identity
from .runner import format_cell, markdown_table, run_metadata, write_json

logger = logging.getLogger(__name__)


def _agreement(single: NestIndex, on_ray: NestIndex, queries: list[str]) -> dict[str, Any]:
    """Token equality, the largest key difference and top-5 retrieval agreement of two builds."""
    a, b = single.datastore.precomputed, on_ray.datastore.precomputed
    same_tokens = all(np.array_equal(a.passage(i).token_ids, b.passage(i).token_ids) for i in range(a.num_passages))
    key_diff = max(
        float(np.abs(a.passage(i).keys.astype(np.float32) - b.passage(i).keys.astype(np.float32)).max(initial=0.0))
        for i in range(a.num_passages)
    )
    same_top5 = sum([p.id for p, _ in single.retrieve(q, 5)] == [p.id for p, _ in on_ray.retrieve(q, 5)] for q in queries)
    return {"tokens_equal": same_tokens, "max_key_abs_diff": key_diff, "top5_equal": f"{same_top5}/{len(queries)}"}


def _texts_and_spans(path: Path) -> list[tuple[Any, ...]]:
    """(id, text, spans) of each output line: what must not depend on where it ran (stats do)."""
    return [(r["id"], r["text"], r["spans"]) for _, r in iter_jsonl(path)]


def _items(folder: Path, titles: list[str]) -> list[JobItem]:
    """The biography prompts of ``titles``, written as a job's input and read back."""
    path = folder / "items.jsonl"
    path.write_text("".join(json.dumps({"id": t, "prompt": f"Tell me a bio of {t}.", "query": t}) + "\n" for t in titles))
    return read_items(path)


def run_ray_bench(
    *,
    passages: int = 500,
    items: int = 6,
    max_new_tokens: int = 48,
    batch_size: int = 2,
    workers: int = 2,
    address: Optional[str] = None,
    out_dir: Path = Path("results/ray"),
) -> dict[str, Any]:
    """Time the build and generation on Ray against one process; write ``ray.json`` and ``ray.md``.

    Args:
        passages: the first this many Wikipedia summaries about people.
        items: biography prompts (of the first passages' titles) to generate for.
        batch_size: items per batched-decoder call and per Ray task.
        workers: Ray actors, one CPU each.
        address: a Ray cluster (None: a local one of ``workers`` CPUs).
    """
    corpus = load_wikipedia_summaries(topic="People", limit=passages)
    start = time.perf_counter()
    lm = load_lm()
    lm_load_s = time.perf_counter() - start
    settings = {"mode": "nest", "max_new_tokens": max_new_tokens}
    with tempfile.TemporaryDirectory(prefix="nest-ray-bench-") as tmp_name:
        tmp = Path(tmp_name)
        start = time.perf_counter()
        single = NestIndex.build(corpus, lm, precompute_keys=True, show_progress=False, calibrate=False)  # as the Ray build
        single.save(tmp / "single")
        single_s = time.perf_counter() - start
        start = time.perf_counter()
        with ray_cluster(address, num_cpus=workers) as ray:
            ray_start_s = time.perf_counter() - start
            start = time.perf_counter()
            on_ray = build_index_on_ray(corpus, lm, tmp / "ray", workers=workers)
            ray_build_s = time.perf_counter() - start
            agreement = _agreement(single, on_ray, [p.title for p in corpus[:: max(1, len(corpus) // 20)]])
            job = _items(tmp, [p.title for p in corpus[:items]])
            decoder = single.decoder()
            decoder.config = decoder.config.updated(**settings)
            identity = index_identity(tmp / "single")
            start = time.perf_counter()
            run_job(
                job, tmp / "local.jsonl", in_process_runner(decoder), chunk_size=batch_size,
                settings=job_settings(index=identity, lm_fingerprint=lm.fingerprint(), config=decoder.config),
            )
            local_s = time.perf_counter() - start
            start = time.perf_counter()
            with ray_generator(tmp / "single", overrides=settings, workers=workers) as runner:
                actors_s = time.perf_counter() - start
                run_job(
                    job, tmp / "ray.jsonl", runner, chunk_size=batch_size,
                    settings=job_settings(index=identity, lm_fingerprint=runner.lm_fingerprint, config=decoder.config),
                )
            ray_gen_s = time.perf_counter() - start
            resources = ray.cluster_resources()
        same_outputs = _texts_and_spans(tmp / "local.jsonl") == _texts_and_spans(tmp / "ray.jsonl")
    info = single.info()
    result = {
        **run_metadata(single, decoder.config),
        "driver_torch_threads": torch.get_num_threads(),
        "cluster_cpus": resources.get("CPU"),
        "build": {
            "passages": len(corpus), "tokens": info["tokens"], "workers": workers,
            "lm_load_s": lm_load_s, "single_process_s": single_s, "ray_start_s": ray_start_s, "ray_build_s": ray_build_s,
            "ray_over_single": ray_build_s / single_s, "agreement": agreement,
        },
        "generate": {
            "items": items, "max_new_tokens": max_new_tokens, "batch_size": batch_size, "workers": workers,
            "in_process_s": local_s, "ray_s": ray_gen_s, "ray_actor_start_s": actors_s,
            "ray_over_in_process": ray_gen_s / local_s, "outputs_equal": same_outputs,
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "ray.json", result)
    (out_dir / "ray.md").write_text(_markdown(result), encoding="utf-8")
    return result


def _markdown(result: dict[str, Any]) -> str:
    """``ray.md``: one row per job; what each Ray time includes is in the columns."""
    b, g = result["build"], result["generate"]
    agreement = b["agreement"]
    table = markdown_table(
        ["job", "one process (s)", "Ray (s)", "Ray / one process", "of which worker start (s)", "Ray runtime start, not counted (s)", "agreement"],
        [
            [f"build {b['passages']} passages ({b['tokens']} tokens), {b['workers']} worker(s)", b["single_process_s"], b["ray_build_s"],
             b["ray_over_single"], None, b["ray_start_s"],
             f"tokens equal: {format_cell(agreement['tokens_equal'])}; largest key difference {agreement['max_key_abs_diff']:.3g}; "
             f"same top-5 passages: {agreement['top5_equal']}"],
            [f"generate {g['items']} items x {g['max_new_tokens']} tokens, batches of {g['batch_size']}, {g['workers']} worker(s)",
             g["in_process_s"], g["ray_s"], g["ray_over_in_process"], g["ray_actor_start_s"], None,
             f"same texts and spans: {format_cell(g['outputs_equal'])}"],
        ],
    )
    threads = result.get("driver_torch_threads")
    setup = f"one process: {threads} torch thread(s); " if threads else ""
    return (
        f"# Ray against one process\n\n`{result['command']}` ({result['date']}; {setup}Ray: {result['cluster_cpus']:g} CPUs, "
        f"one per worker)\n\nThe one-process build time excludes loading the LM ({b['lm_load_s']:.1f} s), loaded before; "
        f"the Ray build time includes starting the workers and loading an LM and an embedder on each.\n\n{table}\n"
    )
