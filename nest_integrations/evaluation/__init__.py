"""Evaluation of NEST generations: metrics and task (item) builders."""

from nest_integrations.evaluation.metrics import (
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
from nest_integrations.evaluation.tasks import (
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
