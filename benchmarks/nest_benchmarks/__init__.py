"""The benchmarks of nest_integrations, a project beside the library (``pip install -e benchmarks``):
the evaluation tasks and metrics, the runner behind ``nest eval``, the benches behind ``nest bench``,
and the documents and questions they run on (``data/``, package data of this package)."""

from .metrics import (
    aggregate,
    answer_recall,
    normalize_answer,
    opens_with_entity,
    opens_with_other_name,
    rouge_scores,
    span_integrity,
    spans_tile_text,
    tokens_per_forward,
    year_precision,
    years,
)
from .tasks import (
    TASKS,
    EvalItem,
    bio_items,
    completion_items,
    get_task,
    qa_items,
)

__all__ = [
    "TASKS",
    "EvalItem",
    "aggregate",
    "answer_recall",
    "bio_items",
    "completion_items",
    "get_task",
    "normalize_answer",
    "opens_with_entity",
    "opens_with_other_name",
    "qa_items",
    "rouge_scores",
    "span_integrity",
    "spans_tile_text",
    "tokens_per_forward",
    "year_precision",
    "years",
]

_LAZY_EXPORTS = {
    "perplexity": "runner",
    "run_eval": "runner",
    "score_item": "runner",
    "run_bench": "bench",
    "run_sweep": "bench",
}
__all__ += list(_LAZY_EXPORTS)


def __getattr__(name: str):
    """Import the runner and the benchmark on first use: they load torch and the decoder,
    which the metrics and tasks above do not need."""
    if name in _LAZY_EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
