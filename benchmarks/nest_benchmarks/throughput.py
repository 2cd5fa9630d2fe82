"""Throughput benchmark: NEST one by one, batched and under concurrent callers, beside its lossless peers.

``nest bench batching`` (:func:`run_throughput`) generates for the same prompts
with the same ``max_new_tokens`` in every configuration, all in one process and
one run, and writes ``bench.json`` and ``bench.md``. The configurations, in the
order they run:

NEST (the index's decoder with the default :class:`NestConfig`; the keys of every
retrieved passage are precomputed before timing, as in ``nest bench speed``):

* ``nest``: ``decoder.generate`` for one prompt after another;
* ``nest batch B`` (B = 1, 4, 8, 16): one ``decoder.generate_batch(prompts,
  max_batch=B)``, B rows sharing each forward, a finished row's place taken by
  the next prompt;
* ``nest 8 threads``: 8 threads calling ``decoder.generate`` at once (a pool of 8
  workers over the prompts); its serial counterpart is ``nest``;
* ``ChatNest`` and ``ChatNest 8 async``: the LangChain chat model over the same
  decoder, ``invoke`` one prompt after another vs ``asyncio.gather`` of
  ``ainvoke`` with 8 calls in flight (the event loop's default executor is given
  8 threads, so 8 calls can run at once whatever the number of cores: asyncio's
  own default is ``min(32, cores + 4)``).

Only public API is called, so the concurrent rows measure whatever the library
does with concurrent callers.

Peers (transformers ``generate``, greedy, each row stopping at EOS as NEST does;
tokens after EOS and padding are not counted):

* ``LM batch B``: the plain prompt (the decoder's base-mode prompt), B prompts per
  left-padded batch; ``LM batch 1`` is plain greedy ``generate``;
* ``RAG``: the in-context RAG prompt, i.e. the decoder's rag-mode prompt over the
  first ``rag_passages`` of the same first-stage hits NEST retrieves, one prompt
  at a time;
* ``prompt lookup``: the same RAG prompt with prompt lookup decoding
  (``prompt_lookup_num_tokens``, default 10, transformers' usual value; batch
  size 1 only). Lossless: its text should equal ``RAG``'s.

Throughput is generated tokens / wall seconds over the whole prompt set, per
configuration. NEST's wall time holds everything a caller waits for (retrieval,
relevance gate, formatting, detokenisation); the peers' prompts are built,
retrieval included, before their timer starts, which favours the peers. With
``repeats`` > 1 every configuration runs in that many interleaved rounds and
keeps its fastest (the least disturbed on a shared machine). Ratios
are within the run: ``vs nest`` (tokens/s over ``nest``'s), ``vs prompt lookup``,
and ``same text`` (share of prompts whose text equals that of the configuration
named in ``reference``: ``nest`` for the NEST rows, ``ChatNest`` for its async
row, ``LM batch 1`` for the batched LM, ``RAG`` for prompt lookup).

Quality per configuration: mean ROUGE-1 F1 against the reference over the
biography items and mean answer recall over the question items
(:mod:`~nest_benchmarks.metrics`).

Prompt set (:func:`throughput_items`): ``n`` items drawn with ``seed``, by default a
third of each kind of :data:`PROMPT_KINDS`, interleaved so every batch mixes them:
biographies of people in the index (NEST copies most of the answer in about two
forwards), questions about people in the index (NEST opens at the passage
window that answers and copies in a few forwards), and questions about things the index does not hold (the
other topics of the bundled Wikipedia summaries: the relevance gate keeps
nothing and NEST writes with the LM alone, one token per forward). The last kind
is where batching has decoding steps to share; ``kinds`` (``--kinds``) picks a
subset, e.g. ``wiki-qa-outside`` alone for the case where every row decodes token
by token. The items are drawn by seed, not chosen.

Memory, during ``nest batch`` at the largest B (all ``n`` prompts at once when
``n`` is smaller): the peak bytes of the KV cache
handed to any forward (the packed cache of all rows, live and dead columns, with
its column count) and the peak RSS growth over the run (psutil, sampled every
5 ms; without psutil the growth of the process's peak RSS, which only shows
growth beyond the earlier peak, so a lower bound). RSS growth counts only memory
the process did not hold already (the allocator reuses what warm-ups and earlier
rows freed), so it can read near 0; the KV cache figure is the direct one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nest_integrations import NestDecoder, NestIndex, load_wikipedia_summaries
from nest_integrations.model.lm import cache_argument
from .bench import hf_generate, peak_rss_mib, precomputed_datastore, prompt_ids
from .metrics import aggregate, answer_recall, rouge_scores
from .runner import (
    checked_choices,
    decoder_over,
    format_cell,
    markdown_table,
    ratio,
    run_config,
    run_metadata,
    write_json,
)
from .tasks import EvalItem, bio_items, wiki_qa_items

__all__ = ["BATCH_SIZES", "CONCURRENCY", "PROMPT_KINDS", "PROMPT_LOOKUP_TOKENS", "run_throughput", "throughput_items"]

logger = logging.getLogger(__name__)

BATCH_SIZES: tuple[int, ...] = (1, 4, 8, 16)
CONCURRENCY = 8
"""Concurrent callers of the thread and async rows."""
PROMPT_LOOKUP_TOKENS = 10
"""``prompt_lookup_num_tokens``: the longest n-gram continuation proposed from the prompt per step."""
PROMPT_KINDS: tuple[str, ...] = ("bio", "wiki-qa", "wiki-qa-outside")
"""The prompt kinds (see the module docstring); the default set is a third of each."""

BATCH_TARGET = 3.0
"""Goal of ``nest batch 8`` tokens/s over ``nest`` tokens/s."""
CONCURRENCY_TARGET = 2.0
"""Goal of 8 concurrent callers' tokens/s over the same calls made serially."""
_RSS_SAMPLE_S = 0.005


@dataclass(frozen=True)
class _Generated:
    """One prompt's output in one configuration: its text and generated token count."""

    text: str
    new_tokens: int


@dataclass(frozen=True)
class _Config:
    """A benchmarked configuration: ``run(items, max_new_tokens)`` gives one output per item, in order."""

    name: str
    what: str
    width: int
    """Rows per forward (B) or concurrent callers."""
    reference: str | None
    run: Callable[[Sequence[EvalItem], int], list[_Generated]]


# --------------------------------------------------------------------------- prompts


def _split(n: int, parts: int) -> list[int]:
    """``n`` split into ``parts`` counts differing by at most one, the larger first."""
    return [n // parts + (i < n % parts) for i in range(parts)]


def _kind_items(index: NestIndex, kind: str, count: int, seed: int) -> list[EvalItem]:
    """``count`` items of one of :data:`PROMPT_KINDS`, each with ``meta["kind"]``."""
    if kind == "bio":
        items = bio_items(count, seed, passages=index.passages)
    elif kind == "wiki-qa":
        items = wiki_qa_items(count, seed, passages=index.passages)
    else:  # questions about the bundled summaries the index does not hold (by id and title)
        known_ids = {p.id for p in index.passages}
        known_titles = {p.title for p in index.passages if p.title}
        pool = [p for p in load_wikipedia_summaries() if p.id not in known_ids and p.title not in known_titles]
        items = [replace(item, id=f"{kind}/{item.id.split('/', 1)[1]}") for item in wiki_qa_items(count, seed, passages=pool)]
    return [replace(item, meta={**item.meta, "kind": kind}) for item in items]


def throughput_items(
    index: NestIndex, n: int, seed: int = 0, kinds: Sequence[str] = PROMPT_KINDS
) -> list[EvalItem]:
    """The bench's prompt set: ``n`` items, an equal share of each of ``kinds``, interleaved.

    Biographies and questions about people come from the index's corpus
    (:func:`~.tasks.bio_items`, :func:`~.tasks.wiki_qa_items`); the outside
    questions from the bundled Wikipedia summaries that are not in the index.
    Each item's ``meta["kind"]`` names its kind; the first kinds get one more
    item when ``n`` does not divide evenly.

    Raises:
        ValueError: ``n < 1``, empty, repeated or unknown kinds, or too few
            qualifying items of a kind (an index that is not over Wikipedia
            people, or one holding every summary).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    kinds = checked_choices(kinds, PROMPT_KINDS, "prompt kind")
    shares = [_kind_items(index, kind, count, seed) for kind, count in zip(kinds, _split(n, len(kinds)))]
    return [share[i] for i in range(len(shares[0])) for share in shares if i < len(share)]


def _quality(item: EvalItem, text: str) -> dict[str, float | None]:
    """ROUGE-1 F1 vs the reference for items with one, answer recall for question items."""
    if "answers" in item.meta:
        return {"rouge1": None, "answer_recall": answer_recall(text, item.meta["answers"])}
    return {"rouge1": rouge_scores(text, item.reference)["rouge1"], "answer_recall": None}


# --------------------------------------------------------------------------- configurations


def _nest_configs(decoder: NestDecoder, batch_sizes: Sequence[int], concurrency: int) -> list[_Config]:
    """NEST one by one, batched at each B, and ``concurrency`` threads calling ``generate``."""

    def one(item: EvalItem, max_new: int) -> _Generated:
        output = decoder.generate(item.prompt, query=item.query, max_new_tokens=max_new)
        return _Generated(output.text, output.stats.new_tokens)

    def batched(b: int) -> Callable[[Sequence[EvalItem], int], list[_Generated]]:
        def run(items: Sequence[EvalItem], max_new: int) -> list[_Generated]:
            outputs = decoder.generate_batch(
                [i.prompt for i in items], queries=[i.query for i in items], max_batch=b, max_new_tokens=max_new
            )
            return [_Generated(o.text, o.stats.new_tokens) for o in outputs]

        return run

    def threads(items: Sequence[EvalItem], max_new: int) -> list[_Generated]:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(lambda item: one(item, max_new), items))

    return [
        _Config("nest", "decoder.generate, one prompt after another", 1, None,
                lambda items, max_new: [one(item, max_new) for item in items]),
        *(
            _Config(f"nest batch {b}", f"decoder.generate_batch, max_batch={b}", b, "nest", batched(b))
            for b in batch_sizes
        ),
        _Config(f"nest {concurrency} threads", f"{concurrency} threads calling decoder.generate at once",
                concurrency, "nest", threads),
    ]


def _chat_configs(decoder: NestDecoder, concurrency: int) -> list[_Config]:
    """LangChain ``ChatNest`` over ``decoder``: ``invoke`` serially vs ``concurrency`` ``ainvoke`` in flight."""
    try:
        from nest_integrations.langchain import ChatNest
    except ImportError as err:
        raise ImportError(
            "the throughput benchmark's ChatNest rows need LangChain: pip install 'nest-integrations[langchain]'"
        ) from err

    chat = ChatNest.from_decoder(decoder)

    def to_generated(message: Any) -> _Generated:
        return _Generated(message.text, int(message.usage_metadata["output_tokens"]))

    def serial(items: Sequence[EvalItem], max_new: int) -> list[_Generated]:
        return [to_generated(chat.invoke(i.prompt, query=i.query, max_new_tokens=max_new)) for i in items]

    async def gather(items: Sequence[EvalItem], max_new: int) -> list[Any]:
        # asyncio.run shuts this executor down when the loop closes.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=concurrency))
        in_flight = asyncio.Semaphore(concurrency)

        async def one(item: EvalItem) -> Any:
            async with in_flight:
                return await chat.ainvoke(item.prompt, query=item.query, max_new_tokens=max_new)

        return await asyncio.gather(*(one(item) for item in items))

    def concurrent(items: Sequence[EvalItem], max_new: int) -> list[_Generated]:
        return [to_generated(m) for m in asyncio.run(gather(items, max_new))]

    return [
        _Config("ChatNest", "ChatNest.invoke, one prompt after another", 1, "nest", serial),
        _Config(f"ChatNest {concurrency} async", f"asyncio.gather of ChatNest.ainvoke, {concurrency} in flight",
                concurrency, "ChatNest", concurrent),
    ]


def _peer_configs(
    index: NestIndex, decoder: NestDecoder, items: Sequence[EvalItem], batch_sizes: Sequence[int], lookup_tokens: int
) -> list[_Config]:
    """transformers ``generate``: the plain prompt batched at each B, the RAG prompt greedy and with prompt lookup.

    Prompt ids are built here, before any timing (the RAG prompts' first-stage
    retrieval included).
    """
    config = decoder.config
    plain = {item.id: prompt_ids(decoder, item.prompt) for item in items}
    rag = {}
    for item in items:
        context = [p for p, _ in index.retrieve(item.query, config.passage_k)[: config.rag_passages]]
        rag[item.id] = prompt_ids(decoder, item.prompt, "rag", context)
    tokenizer, stop_ids = decoder.lm.tokenizer, decoder.eos_ids

    def generate(ids: Mapping[str, list[int]], b: int, **kwargs: Any) -> Callable[[Sequence[EvalItem], int], list[_Generated]]:
        def run(batch_items: Sequence[EvalItem], max_new: int) -> list[_Generated]:
            rows: list[list[int]] = []
            for start in range(0, len(batch_items), b):
                chunk = [ids[item.id] for item in batch_items[start : start + b]]
                rows += hf_generate(decoder.lm, chunk, max_new, stop_ids=stop_ids, **kwargs)[1]
            return [_Generated(tokenizer.decode(row, skip_special_tokens=True), len(row)) for row in rows]

        return run

    return [
        *(
            _Config(f"LM batch {b}", f"transformers generate, plain prompt, {b} per padded batch", b,
                    None if b == 1 else "LM batch 1", generate(plain, b))
            for b in batch_sizes
        ),
        _Config("RAG", "transformers generate, in-context RAG prompt", 1, None, generate(rag, 1)),
        _Config("prompt lookup", f"transformers generate, RAG prompt, prompt_lookup_num_tokens={lookup_tokens}", 1,
                "RAG", generate(rag, 1, prompt_lookup_num_tokens=lookup_tokens)),
    ]


# --------------------------------------------------------------------------- memory


def _cache_bytes(cache: Any) -> tuple[int, int]:
    """Bytes of a transformers cache's key and value tensors, and its column count (0, 0 for no cache)."""
    layers = [layer for layer in getattr(cache, "layers", None) or [] if getattr(layer, "keys", None) is not None]
    if not layers:
        return 0, 0
    size = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    return int(size), int(layers[0].keys.shape[-2])


@contextmanager
def _memory_probe(model: Any) -> Iterator[dict[str, Any]]:
    """Measure the largest KV cache handed to ``model``'s forward and the RSS growth
    while the block runs; the yielded dict is filled when the block exits."""
    found: dict[str, Any] = {"kv_cache_peak_bytes": 0, "kv_cache_peak_columns": 0}
    argument = cache_argument(model)

    def see_cache(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        size, columns = _cache_bytes(kwargs.get(argument))
        if size > found["kv_cache_peak_bytes"]:
            found["kv_cache_peak_bytes"], found["kv_cache_peak_columns"] = size, columns

    try:
        import psutil
    except ImportError:  # the growth of the peak RSS is a lower bound of the growth
        process, sampler = None, None
        before = peak_rss_mib()
    else:
        process = psutil.Process()
        before = process.memory_info().rss / 2**20
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(_RSS_SAMPLE_S):
                peak[0] = max(peak[0], process.memory_info().rss / 2**20)

        sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
        sampler.start()
    handle = model.register_forward_pre_hook(see_cache, with_kwargs=True)
    try:
        yield found
    finally:
        handle.remove()
        if sampler is not None:
            stop.set()
            sampler.join()
            after, source = peak[0], f"psutil RSS sampled every {_RSS_SAMPLE_S * 1000:g} ms"
        else:
            after, source = peak_rss_mib(), "growth of the peak RSS (ru_maxrss): a lower bound"
        found["rss_growth_mib"] = None if before is None or after is None else after - before
        found["rss_source"] = source
        found["kv_cache_bytes_per_column"] = ratio(found["kv_cache_peak_bytes"], found["kv_cache_peak_columns"])


@contextmanager
def _forward_counter(model: Any) -> Iterator[dict[str, int]]:
    """Count ``model``'s decoding forwards (those handed a KV cache; datastore encoding has
    none) and the tokens they are fed, while the block runs."""
    counts = {"lm_forwards": 0, "fed_tokens": 0}
    argument = cache_argument(model)

    def count(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get(argument) is not None and kwargs.get("input_ids") is not None:
            counts["lm_forwards"] += 1
            counts["fed_tokens"] += int(kwargs["input_ids"].numel())

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield counts
    finally:
        handle.remove()


# --------------------------------------------------------------------------- rows and report


def _row(
    config: _Config, items: Sequence[EvalItem], generated: Sequence[_Generated], walls: Sequence[float]
) -> dict[str, Any]:
    """One configuration's totals: tokens, wall seconds (the fastest round, and every
    round's), tokens/s, quality and texts."""
    tokens = sum(g.new_tokens for g in generated)
    wall_s = min(walls)
    quality = aggregate([_quality(item, g.text) for item, g in zip(items, generated)], ("rouge1", "answer_recall"))
    return {
        "name": config.name,
        "what": config.what,
        "width": config.width,
        "reference": config.reference,
        "prompts": len(generated),
        "new_tokens": tokens,
        "wall_s": wall_s,
        "wall_s_rounds": list(walls),
        "tokens_per_s": ratio(tokens, wall_s),
        "rouge1": quality["rouge1"],
        "answer_recall": quality["answer_recall"],
        "texts": [g.text for g in generated],
    }


def _add_ratios(rows: Mapping[str, dict[str, Any]]) -> None:
    """Set each row's ``vs_nest``, ``vs_prompt_lookup`` (tokens/s ratios) and ``same_text``
    (share of prompts with the same stripped text as its reference row, None without one)."""
    for row in rows.values():
        row["vs_nest"] = ratio(row["tokens_per_s"], rows["nest"]["tokens_per_s"])
        row["vs_prompt_lookup"] = ratio(row["tokens_per_s"], rows["prompt lookup"]["tokens_per_s"])
        reference = rows[row["reference"]] if row["reference"] else None
        row["same_text"] = (
            None if reference is None
            else sum(a.strip() == b.strip() for a, b in zip(row["texts"], reference["texts"])) / max(row["prompts"], 1)
        )


def _targets(rows: Mapping[str, Mapping[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    """The issue's goals, each with its measured ratio and whether it is met (None: not measured)."""

    def speed(name: str, over: str) -> float | None:
        return ratio(rows[name]["tokens_per_s"], rows[over]["tokens_per_s"]) if name in rows and over in rows else None

    def at_least(value: float | None, goal: float) -> bool | None:
        return None if value is None else value >= goal

    nest, lookup = rows["nest"], rows["prompt lookup"]
    quality_ok = all(
        nest[key] is None or lookup[key] is None or nest[key] >= lookup[key] for key in ("rouge1", "answer_recall")
    )
    over_lookup = speed("nest", "prompt lookup")
    return [
        {"target": "nest batch 8 tokens/s over nest (one by one)", "goal": BATCH_TARGET,
         "measured": speed("nest batch 8", "nest"), "met": at_least(speed("nest batch 8", "nest"), BATCH_TARGET)},
        {"target": f"nest {concurrency} threads tokens/s over nest (serial)", "goal": CONCURRENCY_TARGET,
         "measured": speed(f"nest {concurrency} threads", "nest"),
         "met": at_least(speed(f"nest {concurrency} threads", "nest"), CONCURRENCY_TARGET)},
        {"target": f"ChatNest {concurrency} async tokens/s over ChatNest (serial)", "goal": CONCURRENCY_TARGET,
         "measured": speed(f"ChatNest {concurrency} async", "ChatNest"),
         "met": at_least(speed(f"ChatNest {concurrency} async", "ChatNest"), CONCURRENCY_TARGET)},
        {"target": "nest tokens/s over prompt lookup, ROUGE-1 and answer recall >= prompt lookup's", "goal": 1.0,
         "measured": over_lookup, "met": None if over_lookup is None else over_lookup > 1.0 and quality_ok},
    ]


_COLUMNS: tuple[tuple[str, str], ...] = (
    ("what", "what"),
    ("width", "B / callers"),
    ("new_tokens", "tokens"),
    ("lm_forwards", "LM forwards"),
    ("fed_tokens", "fed tokens"),
    ("wall_s", "wall s"),
    ("tokens_per_s", "tok/s"),
    ("vs_nest", "vs nest"),
    ("vs_prompt_lookup", "vs prompt lookup"),
    ("rouge1", "ROUGE-1 (bio)"),
    ("answer_recall", "answer recall (QA)"),
    ("reference", "reference"),
    ("same_text", "same text"),
)


def _markdown(bench: Mapping[str, Any]) -> str:
    """``bench.md``: run facts, the configuration table, the targets and memory."""
    rows = [[name] + [row[key] for key, _ in _COLUMNS] for name, row in bench["rows"].items()]
    targets = [[t["target"], t["goal"], t["measured"], t["met"]] for t in bench["targets"]]
    memory = bench["memory"]
    kinds = ", ".join(f"{kind} {count}" for kind, count in bench["prompt_kinds"].items())
    return "\n".join(
        [
            "# NEST throughput benchmark",
            "",
            f"- model: {bench['model']}; prompts: {bench['n']} ({kinds}; seed {bench['seed']}); "
            f"max_new_tokens: {bench['max_new_tokens']}; rounds: {bench['repeats']} (wall s: the fastest); "
            f"whole run {format_cell(bench['bench_wall_s'])} s",
            f"- keys: {bench['precomputed_source']}",
            f"- date: {bench['date']}; command: `{bench['command']}`",
            "",
            "## Configurations",
            "",
            markdown_table(["configuration"] + [header for _, header in _COLUMNS], rows),
            "",
            "tok/s = generated tokens / wall seconds over all prompts; vs nest and vs prompt lookup are tokens/s "
            "ratios within this run; same text = share of prompts whose text equals the reference configuration's; "
            "LM forwards = the model's decoding forwards (prefills included), fed tokens = the tokens they took in. "
            "NEST rows include retrieval; the peers' prompts were built before their timers started.",
            "",
            "## Targets",
            "",
            markdown_table(["target", "goal", "measured", "met"], targets),
            "",
            "## Memory",
            "",
            f"During `nest batch {memory['batch']}`: peak KV cache handed to a forward "
            f"{format_cell(memory['kv_cache_peak_bytes'] / 2**20)} MiB ({memory['kv_cache_peak_columns']} columns, "
            f"{format_cell(memory['kv_cache_bytes_per_column'])} bytes per column); RSS growth "
            f"{format_cell(memory['rss_growth_mib'])} MiB ({memory['rss_source']}).",
            "",
        ]
    )


# --------------------------------------------------------------------------- the bench


def _check_widths(batch_sizes: Sequence[int], concurrency: int, lookup_tokens: int) -> tuple[int, ...]:
    """Validated batch sizes (sorted, unique).

    Raises:
        ValueError: no batch size, one below 1, or ``concurrency`` / ``lookup_tokens`` below 1.
    """
    sizes = tuple(sorted(set(int(b) for b in batch_sizes)))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be integers >= 1, got {list(batch_sizes)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if lookup_tokens < 1:
        raise ValueError(f"prompt_lookup_tokens must be >= 1, got {lookup_tokens}")
    return sizes


def run_throughput(
    index: NestIndex,
    *,
    n: int = 16,
    seed: int = 0,
    max_new_tokens: int = 64,
    out_dir: str | Path,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    concurrency: int = CONCURRENCY,
    prompt_lookup_tokens: int = PROMPT_LOOKUP_TOKENS,
    kinds: Sequence[str] = PROMPT_KINDS,
    repeats: int = 1,
    config_overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure every configuration of the module docstring on the same prompts; write ``bench.json`` and ``bench.md``.

    Every configuration first runs once, untimed, on the first two prompts with a
    budget of 2 tokens, so lazily initialised paths (thread pools, the prompt
    lookup candidate generator) are warm before anything is timed.

    Args:
        index: an index over Wikipedia people (the default index), see :func:`throughput_items`.
        n: prompts (all configurations run all of them).
        seed: item sampling seed.
        max_new_tokens: generation budget per prompt, the same for every configuration.
        out_dir: folder for ``bench.json`` and ``bench.md`` (created if needed).
        batch_sizes: the B of the ``nest batch`` and ``LM batch`` rows; memory is
            measured at the largest.
        concurrency: callers of the thread and async rows.
        prompt_lookup_tokens: ``prompt_lookup_num_tokens`` of the prompt lookup row.
        kinds: the prompt kinds, in equal shares (:func:`throughput_items`).
        repeats: rounds over all configurations (each round runs every one in
            turn); a row's ``wall_s`` is its fastest round, the least disturbed by
            other work on a shared machine. Each round costs a full run.
        config_overrides: :class:`NestConfig` fields (not mode, max_new_tokens, use_chat_template).

    Returns:
        The benchmark as written to ``bench.json``: run metadata, ``n``, ``seed``,
        ``max_new_tokens``, ``item_ids``, ``prompt_kinds`` (count per kind),
        ``repeats``, ``bench_wall_s`` (the whole run, warm-ups and set-up
        included), ``rows`` (per configuration: what, width, prompts,
        new_tokens, lm_forwards, fed_tokens, wall_s, wall_s_rounds, tokens_per_s, rouge1, answer_recall, reference, same_text, vs_nest,
        vs_prompt_lookup, texts), ``targets`` and ``memory``.

    Raises:
        ValueError: invalid n, batch sizes, concurrency, prompt_lookup_tokens,
            kinds, repeats or overrides; too few items of a kind.
        ImportError: LangChain missing (the ChatNest rows).
    """
    began = time.perf_counter()
    sizes = _check_widths(batch_sizes, concurrency, prompt_lookup_tokens)
    kinds = checked_choices(kinds, PROMPT_KINDS, "prompt kind")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    config = run_config(config_overrides, max_new_tokens)
    items = throughput_items(index, n, seed, kinds)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    datastore, precomputed_source = precomputed_datastore(index, [(i.prompt, i.query) for i in items], config.passage_k)
    decoder = decoder_over(index, datastore, config)
    configs = [
        *_nest_configs(decoder, sizes, concurrency),
        *_chat_configs(decoder, concurrency),
        *_peer_configs(index, decoder, items, sizes, prompt_lookup_tokens),
    ]
    for spec in configs:  # untimed warm-ups
        spec.run(items[:2], 2)

    walls: dict[str, list[float]] = {spec.name: [] for spec in configs}
    outputs: dict[str, list[_Generated]] = {}
    forwards: dict[str, dict[str, int]] = {}
    memory: dict[str, Any] = {}
    largest = f"nest batch {sizes[-1]}"
    for round_ in range(repeats):  # rounds interleave the configurations, so load drift hits them all
        for spec in configs:
            probe = _memory_probe(index.lm.model) if round_ == 0 and spec.name == largest else nullcontext({})
            with probe as probed, _forward_counter(index.lm.model) as counted:
                start = time.perf_counter()
                generated = spec.run(items, max_new_tokens)
                wall = time.perf_counter() - start
            memory.update(probed)
            forwards[spec.name] = counted  # greedy decoding: every round runs the same forwards
            walls[spec.name].append(wall)
            outputs[spec.name] = generated  # greedy decoding: every round writes the same
            logger.info("throughput round %d: %s, %d tokens in %.1f s", round_ + 1, spec.name,
                        sum(g.new_tokens for g in generated), wall)
    rows = {spec.name: {**_row(spec, items, outputs[spec.name], walls[spec.name]), **forwards[spec.name]} for spec in configs}
    _add_ratios(rows)

    bench = {
        **run_metadata(index, config),
        "n": len(items),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "item_ids": [item.id for item in items],
        "prompt_kinds": {kind: sum(item.meta["kind"] == kind for item in items) for kind in kinds},
        "precomputed_source": precomputed_source,
        "rows": rows,
        "targets": _targets(rows, concurrency),
        "memory": {"batch": sizes[-1], **memory},
        "bench_wall_s": time.perf_counter() - began,
    }
    write_json(out / "bench.json", bench)
    (out / "bench.md").write_text(_markdown(bench), encoding="utf-8")
    logger.info("wrote the throughput benchmark to %s", out)
    return bench
