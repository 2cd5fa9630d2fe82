"""Token keys encoded in bfloat16 against float32, on the default LM.

Keys are stored as float16 whatever the encoding precision; the question is
whether the LM forward that produces them may run in bfloat16. Two ways are
measured beside float32 (``NEST_KEY_ENCODING=float32``):

* ``bf16-copy``: a bfloat16 copy of the model used for encoding only (its
  linear layers run oneDNN's bfloat16 kernels; the decoder keeps float32),
  as :mod:`nest_integrations.store.key_precision` does (``NEST_KEY_ENCODING=bfloat16``);
* ``autocast``: the float32 model under ``torch.autocast("cpu", torch.bfloat16)``
  (ops on autocast's list run in bfloat16; the pre-packed float32 linear
  layers of :mod:`nest_integrations.model.packed_linear` do not).

Per variant: encoding speed over ``--passages`` Wikipedia summaries of people
(wall and CPU seconds, the best and the median of ``--rounds`` rounds, variants
alternating round by round so machine load hits them alike: on a shared
machine CPU seconds are the steadier measure), key error against float32, top-1 neighbour
agreement of decoding queries (the key-layer states of ``--prompts`` NEST
answers, "Tell me a bio of <name>.", written over float32 keys) searched over
each prompt's first-stage passages, and whether NEST's answers over the
variant's keys are identical to those over float32 keys, item by item.

Run from the repository root:
``.venv/bin/python results/bench-key-dtype/bench_key_dtype.py --out results/bench-key-dtype``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from nest_benchmarks.key_bench import decoding_queries
from nest_benchmarks.runner import markdown_table, write_json
from nest_integrations import NestConfig, NestIndex, load_lm, load_wikipedia_summaries
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.encoder import EncodedPassage, PassageEncoder
from nest_integrations.store.key_precision import ENV_VAR, cpu_has_bf16
from nest_integrations.store.key_sources import PrecomputedKeys

TOP_K_OVERLAP = 10


def cpu_bf16_support() -> dict[str, bool]:
    """What this CPU offers for bfloat16 matrix products (torch's own probes)."""
    return {
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
        "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    }


@contextlib.contextmanager
def key_encoding(choice: str) -> Iterator[None]:
    """``NEST_KEY_ENCODING=choice`` inside the block."""
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = choice
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENV_VAR]
        else:
            os.environ[ENV_VAR] = before


def variants(encoder: PassageEncoder) -> dict[str, Callable[[list[str]], list[EncodedPassage]]]:
    """Encoding functions: float32, the bfloat16 model copy, float32 under autocast."""

    def float32(texts: list[str]) -> list[EncodedPassage]:
        with key_encoding("float32"):
            return encoder.encode(texts)

    def bf16_copy(texts: list[str]) -> list[EncodedPassage]:
        with key_encoding("bfloat16"):
            return encoder.encode(texts)

    def autocast(texts: list[str]) -> list[EncodedPassage]:
        with key_encoding("float32"), torch.autocast("cpu", dtype=torch.bfloat16):
            return encoder.encode(texts)

    return {"float32": float32, "bf16-copy": bf16_copy, "autocast": autocast}


def key_error(reference: list[EncodedPassage], other: list[EncodedPassage]) -> float:
    """Mean over keys of ||k' - k|| / ||k|| (entry keys only)."""
    ref = np.concatenate([e.keys[e.valid] for e in reference]).astype(np.float32)
    oth = np.concatenate([e.keys[e.valid] for e in other]).astype(np.float32)
    return float(np.mean(np.linalg.norm(oth - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-6)))


def run(passage_count: int, prompts: int, rounds: int, max_new_tokens: int) -> dict[str, Any]:
    lm = load_lm()
    passages = load_wikipedia_summaries(topic="People", limit=passage_count)
    index = NestIndex.build(passages, lm, show_progress=False)
    encoder = index.datastore.encoder
    texts = [p.text for p in passages]
    tokens = sum(len(encoder.tokenize(t)[0]) for t in texts)
    encode = variants(encoder)
    for fn in encode.values():
        fn(texts[:2])  # warm-up: the bfloat16 copy, weight packing, oneDNN kernel choice
    seconds: dict[str, list[float]] = {name: [] for name in encode}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in encode}
    keys: dict[str, list[EncodedPassage]] = {}
    for round_ in range(rounds):
        order = list(encode) if round_ % 2 == 0 else list(reversed(encode))
        for name in order:
            start, cpu_start = time.perf_counter(), time.process_time()
            keys[name] = encode[name](texts)
            seconds[name].append(time.perf_counter() - start)
            cpu_seconds[name].append(time.process_time() - cpu_start)

    config = NestConfig(max_new_tokens=max_new_tokens)
    people = [p.title for p in passages[:prompts]]
    answers: dict[str, list[str]] = {}
    for name, encoded in keys.items():
        index.datastore.attach_precomputed(PrecomputedKeys.from_encoded(encoded, encoder))
        decoder = index.decoder(config)
        answers[name] = [decoder.generate(f"Tell me a bio of {who}.", query=who).text for who in people]

    index.datastore.attach_precomputed(PrecomputedKeys.from_encoded(keys["float32"], encoder))
    decoder = index.decoder(config)
    agreement: dict[str, dict[str, list[float]]] = {name: {"top1": [], "top1_token": [], "overlap": []} for name in keys}
    query_count = 0
    for who, text in zip(people, answers["float32"]):
        queries = decoding_queries(decoder, f"Tell me a bio of {who}.", text)
        query_count += len(queries)
        indices = [index.datastore.index_of(p.id) for p, _ in index.retrieve(who, config.passage_k)]
        found = {name: CandidateSet(indices, [encoded[i] for i in indices]).search(queries, config.token_k) for name, encoded in keys.items()}
        ref = found["float32"]
        for name, hits in found.items():
            agreement[name]["top1"] += (hits.entries[:, 0] == ref.entries[:, 0]).tolist()
            agreement[name]["top1_token"] += (hits.values[:, 0] == ref.values[:, 0]).tolist()
            agreement[name]["overlap"] += [
                len(set(a) & set(b)) / TOP_K_OVERLAP
                for a, b in zip(hits.entries[:, :TOP_K_OVERLAP].tolist(), ref.entries[:, :TOP_K_OVERLAP].tolist())
            ]
    rows = []
    for name in keys:
        rows.append({
            "encoding": name,
            "tokens_per_s_best": tokens / min(seconds[name]),
            "tokens_per_cpu_s_median": tokens / statistics.median(cpu_seconds[name]),
            "speed_vs_float32_best": min(seconds["float32"]) / min(seconds[name]),
            "cpu_speed_vs_float32_median": statistics.median(cpu_seconds["float32"]) / statistics.median(cpu_seconds[name]),
            "seconds_all_rounds": seconds[name],
            "cpu_seconds_all_rounds": cpu_seconds[name],
            "key_rel_error": key_error(keys["float32"], keys[name]),
            "top1_agreement": float(np.mean(agreement[name]["top1"])),
            "top1_token_agreement": float(np.mean(agreement[name]["top1_token"])),
            f"top{TOP_K_OVERLAP}_overlap": float(np.mean(agreement[name]["overlap"])),
            "identical_outputs": sum(a == b for a, b in zip(answers[name], answers["float32"])),
        })
    return {
        "command": shlex.join(["python", *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": lm.name,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": cpu_bf16_support(),
        "bf16_default_here": cpu_has_bf16(),
        "threads": torch.get_num_threads(),
        "passages": len(passages),
        "tokens": tokens,
        "rounds": rounds,
        "prompts": len(people),
        "queries": query_count,
        "passage_k": config.passage_k,
        "max_new_tokens": max_new_tokens,
        "rows": rows,
        "answers": answers,
    }


def markdown(report: dict[str, Any]) -> str:
    table = markdown_table(
        ["encoding", "tokens/s (best)", "speed vs float32 (best)", "tokens per CPU s (median)", "CPU speed vs float32 (median)", "key rel. error", "top-1 agreement", "top-1 token agreement",
         f"top-{TOP_K_OVERLAP} overlap", f"identical outputs (of {report['prompts']})"],
        [[r["encoding"], r["tokens_per_s_best"], r["speed_vs_float32_best"], r["tokens_per_cpu_s_median"],
          r["cpu_speed_vs_float32_median"], r["key_rel_error"], r["top1_agreement"],
          r["top1_token_agreement"], r[f"top{TOP_K_OVERLAP}_overlap"], r["identical_outputs"]] for r in report["rows"]],
    )
    support = ", ".join(f"{k} {v}" for k, v in report["cpu_bf16"].items())
    return "\n".join([
        "# Token keys encoded in bfloat16 against float32",
        "",
        f"- model: {report['model']}; torch {report['torch']}, CPU capability {report['cpu_capability']} ({support}), "
        f"{report['threads']} threads; bfloat16 encoding is the default on this CPU: {report['bf16_default_here']}",
        f"- speed: {report['passages']} Wikipedia summaries of people, {report['tokens']} tokens, fastest of "
        f"{report['rounds']} alternating rounds (wall: the best; CPU seconds of this process: the median)",
        f"- agreement: {report['queries']} decoding queries of {report['prompts']} NEST answers (over float32 keys), "
        f"searched over each prompt's {report['passage_k']} first-stage passages; outputs: NEST over each variant's keys, "
        f"max_new_tokens {report['max_new_tokens']}",
        f"- date: {report['date']}; command: `{report['command']}`",
        "",
        table,
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = run(args.passages, args.prompts, args.rounds, args.max_new_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "bench.json", report)
    (args.out / "bench.md").write_text(markdown(report), encoding="utf-8")
    print(json.dumps(report["rows"], indent=2))


if __name__ == "__main__":
    main()
