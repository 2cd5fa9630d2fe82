"""Resumable JSONL generation jobs: items in, outputs out in input order, restartable.

Input, one JSON object per line (blank lines skipped)::

    {"id": "q1", "prompt": "Tell me a bio of Ada Lovelace.", "query": "Ada Lovelace"}

``prompt`` is required (a string), ``query`` (the first-stage retrieval query)
and ``id`` (default: the line number, as a string) are optional.

Output, one line per item, in input order::

    {"id": "q1", "line": 1, "input_sha256": "...", "text": ..., "spans": ..., "citations": ..., "stats": ...}

that is the item's id and line number, a sha256 of the item and of the
generation settings, then :meth:`NestOutput.to_dict`.

Lines are appended (flushed and fsynced after each chunk) as soon as every
earlier item is done, so a killed job loses at most the chunks in flight. On
restart the lines already there must be the outputs of the first items, with
the same id, line number and sha256: those items are not generated again. A
torn last line (the job was killed while writing it) is dropped. Anything else,
an output of another input or of other settings, is refused with a ValueError
and the file is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobItem:
    """One input line: its 1-based line number, id, prompt, query and sha256 (item + settings)."""

    line: int
    id: Any
    prompt: str
    query: Optional[str]
    sha256: str


ChunkRunner = Callable[[Sequence[Sequence[JobItem]]], Iterator[tuple[int, list[dict[str, Any]]]]]
"""Generates chunks of items: yields ``(chunk number, one output dict per item)``, in any order."""


def item_sha256(item: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """sha256 of an input item and the generation settings, as canonical JSON."""
    blob = json.dumps({"item": item, "settings": settings}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def read_items(path: Path, settings: Mapping[str, Any]) -> list[JobItem]:
    """The items of the JSONL file ``path`` (see the module docstring).

    Args:
        settings: what else decides an output (mode, token budget, model), hashed with each item.

    Raises:
        ValueError: a missing file, or a line (named ``path:line``) that is not a
            JSON object with a string ``prompt`` and a string or null ``query``.
    """
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: invalid JSON ({err})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f"{path}:{number}: each line needs a string 'prompt'")
        if not isinstance(item.get("query"), (str, type(None))):
            raise ValueError(f"{path}:{number}: 'query' must be a string")
        item.setdefault("id", str(number))
        items.append(JobItem(number, item["id"], item["prompt"], item.get("query"), item_sha256(item, settings)))
    if not items:
        raise ValueError(f"{path} holds no items")
    return items


def finished_items(output: Path, items: Sequence[JobItem]) -> int:
    """How many of the first ``items`` ``output`` already holds; drops a torn last line.

    Raises:
        ValueError: a line is not the output of the item at its position (another
            input file, edited items or other settings), or a line other than the
            last is unreadable. The file is not changed.
    """
    if not output.exists():
        return 0
    raw = output.read_bytes()
    lines = raw.split(b"\n")
    torn = lines.pop()  # the bytes after the last newline: b"" unless a write was cut short
    done = 0
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{output}:{number} is not a JSON line; it is not an output of this job. Remove it or choose another --output") from None
        if number > len(items) or not isinstance(record, dict) or (record.get("id"), record.get("line"), record.get("input_sha256")) != (
            items[number - 1].id, items[number - 1].line, items[number - 1].sha256
        ):
            raise ValueError(
                f"{output}:{number} is not the output of input item {number} with these settings "
                "(another input, edited items, or another mode, token budget or model); "
                "remove it or choose another --output"
            )
        done = number
    if torn:
        logger.warning("%s: dropping a torn last line (%d bytes) left by an interrupted job", output, len(torn))
        with open(output, "r+b") as handle:
            handle.truncate(len(raw) - len(torn))
    return done


def run_job(items: Sequence[JobItem], output: Path, run_chunks: ChunkRunner, *, chunk_size: int) -> int:
    """Generate every item ``output`` does not hold yet, appending outputs in input order.

    Args:
        run_chunks: generates chunks (in-process: :func:`in_process_runner`;
            on Ray: :meth:`nest_integrations.distributed.RayGenerator.run_chunks`).
        chunk_size: items per chunk: per batched-decoder call, and per Ray task.

    Returns:
        The number of items generated now (0 when ``output`` was complete).

    Raises:
        ValueError: ``chunk_size`` < 1, or ``output`` holds outputs of another job
            (see :func:`finished_items`).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    done = finished_items(output, items)
    if done:
        logger.info("%s holds %d of %d items; generating the rest", output, done, len(items))
    todo = list(items[done:])
    chunks = [todo[lo : lo + chunk_size] for lo in range(0, len(todo), chunk_size)]
    ready: dict[int, list[dict[str, Any]]] = {}
    next_chunk = 0
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "a", encoding="utf-8") as handle:
        for number, outputs in run_chunks(chunks):
            if len(outputs) != len(chunks[number]):
                raise RuntimeError(f"chunk {number}: {len(outputs)} outputs for {len(chunks[number])} items")  # a bug
            ready[number] = outputs
            while next_chunk in ready:
                for item, out in zip(chunks[next_chunk], ready.pop(next_chunk)):
                    record = {"id": item.id, "line": item.line, "input_sha256": item.sha256, **out}
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
                next_chunk += 1
    return len(todo)


def in_process_runner(decoder: Any, *, max_batch: Optional[int] = None) -> ChunkRunner:
    """A :data:`ChunkRunner` calling ``decoder.generate_batch`` on each chunk in turn, in this process."""

    def run(chunks: Sequence[Sequence[JobItem]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        for number, chunk in enumerate(chunks):
            yield number, generate_chunk(decoder, chunk, max_batch=max_batch)

    return run


def generate_chunk(decoder: Any, chunk: Sequence[JobItem], *, max_batch: Optional[int] = None) -> list[dict[str, Any]]:
    """``decoder.generate_batch`` over the items' prompts and queries; one output dict per item."""
    outputs = decoder.generate_batch([i.prompt for i in chunk], queries=[i.query for i in chunk], max_batch=max_batch)
    return [o.to_dict() for o in outputs]
