"""The ecosystem's standard generation parameters, read as :class:`NestConfig` fields.

LangChain and LlamaIndex models take ``max_tokens`` and ``temperature`` (0 for
greedy). NEST calls the first ``max_new_tokens`` and decodes greedily unless
``do_sample``; both integrations accept the standard names and report the
values NEST actually decodes with.
"""

from __future__ import annotations

from typing import Any, Mapping

from .config import NestConfig

ALIASES = {"max_tokens": "max_new_tokens"}
"""Standard parameter name -> NestConfig field."""


def to_nest_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with standard names renamed to their NestConfig fields (``max_tokens=100`` -> ``max_new_tokens=100``).

    Raises:
        ValueError: both a standard name and its NestConfig field are given, with different values.
    """
    renamed = dict(values)
    for alias, field in ALIASES.items():
        if alias not in renamed:
            continue
        value = renamed.pop(alias)
        if field in renamed and renamed[field] != value:
            raise ValueError(f"{alias}={value!r} and {field}={renamed[field]!r} disagree; give one of them")
        renamed[field] = value
    return renamed


def effective_temperature(config: NestConfig) -> float:
    """The temperature NEST decodes with: ``config.temperature`` when sampling, else 0 (greedy)."""
    return config.temperature if config.do_sample else 0.0
