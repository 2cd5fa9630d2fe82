"""Metadata as plain JSON values.

Passage metadata travels into the output contract (``SourceRef.metadata``),
LangChain / LlamaIndex responses and saved folders, so it is made of JSON
values when the passage is made (:class:`~nest_integrations.corpus.passages.Passage`):
numpy scalars and arrays, dates and a few common types are converted, and
anything else is refused there with an error naming the key, before any
generation runs.

Conversions:

* ``None``, ``bool``, ``int``, ``float``, ``str`` are kept (subclasses such as
  ``np.float64`` or ``np.str_`` become the plain type); a non-finite float is
  kept, and the output contract writes it as ``null``;
* numpy scalars (``np.float32``, ``np.int64``, ``np.bool_``...) become the
  Python number or bool, numpy arrays nested lists;
* ``datetime`` / ``date`` / ``time`` become ISO 8601 strings (``isoformat()``);
* ``pathlib`` paths and ``UUID`` become strings, tuples lists;
* dicts (string keys only) and lists are converted item by item.

Everything else (bytes, sets, complex numbers, arbitrary objects, non-string
dict keys, cycles, nesting deeper than :data:`MAX_DEPTH`) raises ``ValueError``.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from pathlib import PurePath
from typing import Any

import numpy as np

MAX_DEPTH = 64
"""Deepest nesting of lists and dicts accepted in metadata."""


def json_safe(value: Any, where: str = "metadata") -> Any:
    """``value`` made of plain JSON types (see the module docstring).

    Args:
        value: the value to convert.
        where: how the error message names ``value`` (e.g. ``"metadata"``);
            nested items are named ``where['key']`` and ``where[3]``.

    Raises:
        ValueError: a value that cannot be made JSON; the message names it.
    """
    return _convert(value, where, 0, set())


def _convert(value: Any, where: str, depth: int, active: set[int]) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.timedelta64):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value))
    if isinstance(value, (PurePath, uuid.UUID)):
        return str(value)
    if isinstance(value, (dict, list, tuple, np.ndarray)):
        if depth >= MAX_DEPTH:
            raise ValueError(f"{where} is nested deeper than {MAX_DEPTH} levels")
        if id(value) in active:
            raise ValueError(f"{where} contains itself (a cycle cannot be JSON)")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                out = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise ValueError(
                            f"{where} has a key {key!r} of type {type(key).__name__}; metadata keys must be strings"
                        )
                    out[str(key)] = _convert(item, f"{where}[{key!r}]", depth + 1, active)
                return out
            items = value.tolist() if isinstance(value, np.ndarray) else list(value)
            if not isinstance(items, list):  # a 0-d array's tolist() is a scalar
                return _convert(items, where, depth + 1, active)
            return [_convert(item, f"{where}[{i}]", depth + 1, active) for i, item in enumerate(items)]
        finally:
            active.discard(id(value))
    raise ValueError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be made JSON "
        "(use str, int, float, bool, None, a list or a dict of them; numpy values and dates are converted)"
    )
