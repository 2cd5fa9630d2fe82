"""JSON Lines as the format defines them: one JSON value per line, lines end at ``\\n`` only.

Every JSONL file the project reads (a corpus, a saved index's passages, a batch
job's items, QA questions) goes through :func:`iter_jsonl`, so they all agree on
what a line is:

* only ``\\n`` (byte 0x0A) ends a line. ``str.splitlines()`` and text-mode
  files also split on ``\\r``, U+0085, U+2028, U+2029 and a few control
  characters, which valid JSON may carry raw inside a string (or, for ``\\r``,
  between tokens), so a valid record would be cut in two;
* a ``\\r`` before the ``\\n`` (a file written on Windows) is JSON whitespace
  and is accepted;
* a last line without a newline is a line like any other;
* a line of JSON whitespace only (space, tab, ``\\r``) is skipped, but still
  counted, so line numbers in messages are those an editor shows;
* the file is UTF-8; a byte-order mark at its start is accepted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

JSON_WHITESPACE = " \t\r"
"""What a line may hold besides a value (``\\n`` ends it); a line of only these is blank."""


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of the JSONL file ``path``.

    The file is read one line at a time (constant memory for any file size).

    Raises:
        ValueError: as :func:`iter_jsonl_lines`, naming ``path:line``.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    with open(path, "rb") as handle:  # binary lines end at b"\n" and nowhere else
        yield from iter_jsonl_lines(handle, str(path))


def iter_jsonl_lines(lines: Iterable[bytes], where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of ``lines``, the lines of a
    JSONL file as a binary file gives them (each ending at ``b"\n"``), e.g. an open file or a
    :class:`~nest_integrations.core.folder_snapshot.VerifiedStream`.

    Raises:
        ValueError: the message names ``where:line``: bytes that are not UTF-8,
            invalid JSON, or a value that is not a JSON object.
    """
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{where}:{number}: not UTF-8 ({err.reason} at byte {err.start})") from None
        if not line.strip(JSON_WHITESPACE + "\n"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}:{number}: invalid JSON ({err.msg}, column {err.colno})") from None
        except RecursionError:
            raise ValueError(f"{where}:{number}: JSON nested too deeply") from None
        if not isinstance(value, dict):
            raise ValueError(f"{where}:{number}: expected a JSON object, got {type(value).__name__}")
        yield number, value
