"""What callers hand the LangChain :class:`~nest_integrations.langchain.NestVectorStore`, checked:
document ids (given or fresh), a search's ``k`` and its metadata ``filter``."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
from langchain_core.documents import Document

MetadataFilter = Union[Callable[[Document], bool], dict[str, Any]]
"""A document predicate, or metadata values that must all match exactly."""


def resolve_ids(ids: Optional[Sequence[Optional[str]]], count: int) -> list[str]:
    """The given ids, a fresh uuid4 for each None.

    Raises:
        TypeError: an id that is neither a str nor None (``1`` and ``"1"`` would collide).
        ValueError: an empty id, or one id given twice.
    """
    out = []
    for pos, value in enumerate(ids if ids is not None else [None] * count):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"ids[{pos}] must be a str or None, got {type(value).__name__} {value!r}")
        if value == "":
            raise ValueError(f"ids[{pos}] is empty; pass None for a generated id")
        out.append(value if value is not None else str(uuid.uuid4()))
    repeated = sorted(i for i, n in Counter(out).items() if n > 1)
    if repeated:
        raise ValueError(f"ids {repeated} are given more than once; each document needs its own id")
    return out


def check_k(k: Any) -> None:
    """Raise TypeError unless a search's ``k`` is an int (not a bool), ValueError if it is negative."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def matches_filter(document: Document, filter: Optional[MetadataFilter]) -> bool:
    """Whether ``document`` passes ``filter``: None passes all, a predicate decides, a dict's values must all equal
    the document's metadata values."""
    if filter is None:
        return True
    if callable(filter):
        return bool(filter(document))
    return all(document.metadata.get(key) == value for key, value in filter.items())
