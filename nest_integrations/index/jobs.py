"""Resumable JSONL generation jobs: items in, outputs out in input order, restartable.

Input, one JSON object per line (blank lines skipped; lines end at ``\\n`` only,
see :mod:`nest_integrations.core.jsonl`)::

    {"id": "q1", "prompt": "Tell me a bio of Ada Lovelace.", "query": "Ada Lovelace"}

or, for a turn of a conversation, ``messages`` instead of ``prompt``::

    {"id": "q2", "messages": [{"role": "user", "content": "What is a generator?"},
                              {"role": "assistant", "content": "A function that yields."},
                              {"role": "user", "content": "And how do I send a value into it?"}]}

Each item has either ``prompt`` (a string) or ``messages`` (a list of ``{"role",
"content"}`` objects, roles ``system``, ``user`` or ``assistant``, the last one the
user's: the question answered). ``query`` (the first-stage retrieval query;
default: the prompt, or for messages the conversation's query, see
:func:`~nest_integrations.policy.conversation.retrieval_query`) and ``id`` (default: the
line number, as a string) are optional.

Output, one line per item, in input order::

    {"id": "q1", "line": 1, "input_sha256": "...", "settings": {...}, "text": ..., "spans": ..., "stats": ...}

that is the item's id, line number and sha256, the job's settings (see
:func:`job_settings`: the index, the LM and every decoding setting, all that
decides an output besides the item), then :meth:`NestOutput.to_dict`.

Lines are appended (flushed and fsynced after each chunk) as soon as every
earlier item is done, so a killed job loses at most the chunks in flight. On
restart the lines already there must be the outputs of the first items, with
the same id, line number and sha256, and the same settings: those items are not
generated again. A torn last line (the job was killed while writing it) is
dropped; a complete last line that only lacks its newline is kept. Anything
else, an output of another input or of other settings, is refused with a
ValueError naming what differs, and the file is left as it was: resume with the
same settings, or start afresh with another output (or ``restart=True``, CLI
``--restart``, which replaces a job's output, never another file).

One job writes an output at a time: ``nest generate`` holds :func:`output_lock`
on it for the whole job, and a second job on the same output is refused.

The batch size is not a setting: it groups items for speed, and a resumed job
may use another one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence, Union

try:  # POSIX; elsewhere two jobs on one output are not refused
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.core.config import NestConfig

logger = logging.getLogger(__name__)

SHORT_VALUE = 40
"""Characters of a setting's value shown in a mismatch message (fingerprints are longer)."""


MESSAGE_ROLES = ("system", "user", "assistant")
"""The roles a message of an item's ``messages`` may have."""


@dataclass(frozen=True)
class JobItem:
    """One input line: its 1-based line number, id, prompt, query and sha256 (of the item's JSON).

    ``prompt`` is the item's ``prompt`` string or its ``messages`` list (the decoder takes both)."""

    line: int
    id: Any
    prompt: Union[str, list[dict[str, str]]]
    query: Optional[str]
    sha256: str


ChunkRunner = Callable[[Sequence[Sequence[JobItem]]], Iterator[tuple[int, list[dict[str, Any]]]]]
"""Generates chunks of items: yields ``(chunk number, one output dict per item)``, in any order."""


def job_settings(*, index: str, lm_fingerprint: str, config: "NestConfig") -> dict[str, Any]:
    """Everything besides an item that decides its output, as a flat JSON dict.

    Args:
        index: the index's identity (:func:`nest_integrations.index.nest_index.index_identity`:
            the sha256 of its manifest, which lists every file's sha256).
        lm_fingerprint: the decoding LM's weight fingerprint (dtype included:
            float32 and float16 decode differently).
        config: the decoder's :class:`~nest_integrations.core.config.NestConfig`
            (every field: mode, token budget, gate, sampling...).

    Returns:
        ``{"index": ..., "lm": ..., <each config field>: ...}``.
    """
    return {"index": index, "lm": lm_fingerprint, **config.model_dump(mode="json")}


def item_sha256(item: Mapping[str, Any]) -> str:
    """sha256 of an input item, as canonical JSON."""
    blob = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def message_problem(messages: Any) -> Optional[str]:
    """What is wrong with an item's ``messages`` value, naming the field (``messages[2].role``), or None.

    Valid: a non-empty list of ``{"role", "content"}`` objects, each role one of
    :data:`MESSAGE_ROLES`, each content a string, the last message the user's.
    """
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of {\"role\", \"content\"} objects"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"'messages[{i}]' must be a {{\"role\", \"content\"}} object, got {type(message).__name__}"
        if message.get("role") not in MESSAGE_ROLES:
            return f"'messages[{i}].role' must be one of {', '.join(MESSAGE_ROLES)}, got {message.get('role')!r}"
        if not isinstance(message.get("content"), str):
            return f"'messages[{i}].content' must be a string"
    if messages[-1]["role"] != "user":
        return f"'messages[{len(messages) - 1}]' must be the user's question (role 'user'), got role {messages[-1]['role']!r}"
    return None


def read_items(path: Path) -> list[JobItem]:
    """The items of the JSONL file ``path`` (see the module docstring).

    Raises:
        ValueError: a missing file, a file without items, or a line (named
            ``path:line``, and the field at fault) that is not a JSON object
            with either a string ``prompt`` or valid ``messages``
            (:func:`message_problem`), and a string or null ``query``.
    """
    from nest_integrations.core.jsonl import iter_jsonl

    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    items = []
    for number, item in iter_jsonl(path):
        if "prompt" in item and "messages" in item:
            raise ValueError(f"{path}:{number}: give 'prompt' or 'messages', not both")
        if "messages" in item:
            if (problem := message_problem(item["messages"])) is not None:
                raise ValueError(f"{path}:{number}: {problem}")
        elif not isinstance(item.get("prompt"), str):
            raise ValueError(f"{path}:{number}: each line needs a string 'prompt' or a 'messages' list")
        if not isinstance(item.get("query"), (str, type(None))):
            raise ValueError(f"{path}:{number}: 'query' must be a string")
        item.setdefault("id", str(number))
        prompt = item["messages"] if "messages" in item else item["prompt"]
        items.append(JobItem(number, item["id"], prompt, item.get("query"), item_sha256(item)))
    if not items:
        raise ValueError(f"{path} holds no items")
    return items


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHORT_VALUE else text[: SHORT_VALUE - 3] + "..."


def setting_differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``"name: <value then> then, <value now> now"`` for each setting that differs (sorted by name)."""
    missing = object()
    return [
        f"{key}: {'unset' if then.get(key, missing) is missing else _short(then[key])} then, "
        f"{'unset' if now.get(key, missing) is missing else _short(now[key])} now"
        for key in sorted(set(then) | set(now))
        if then.get(key, missing) != now.get(key, missing)
    ]


def _check_line(output: Path, number: int, record: Any, items: Sequence[JobItem], settings: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``record`` (line ``number`` of ``output``) is item ``number``'s output under ``settings``."""
    fresh = "Resume with the same settings, or start afresh: choose another --output, or --restart to replace this one"
    if not isinstance(record, dict) or not {"id", "line", "input_sha256"} <= set(record):
        raise ValueError(f"{output}:{number} is not an output line of a generation job; remove it or choose another --output")
    then = record.get("settings")
    if not isinstance(then, dict):
        raise ValueError(f"{output}:{number} was written without its settings (an older release). {fresh}")
    differences = setting_differences(then, settings)
    if differences:
        raise ValueError(f"{output} was written with other settings ({'; '.join(differences)}). {fresh}")
    if number > len(items):
        raise ValueError(f"{output} holds {number} or more outputs, the input only {len(items)} items (another input?). {fresh}")
    item = items[number - 1]
    if (record["id"], record["line"], record["input_sha256"]) != (item.id, item.line, item.sha256):
        raise ValueError(
            f"{output}:{number} is the output of item {record['id']!r} (input line {record['line']}), not of the "
            f"input's item {number}, {item.id!r} (line {item.line}): another input file or edited items. {fresh}"
        )


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def finished_items(output: Path, items: Sequence[JobItem], settings: Mapping[str, Any]) -> int:
    """How many of the first ``items`` ``output`` already holds under ``settings``.

    A last line cut short by a kill (not JSON) is dropped; a complete last line
    without its newline is kept and the newline added.

    Raises:
        ValueError: a line is not the output of the item at its position (another
            input file, edited items) or was written with other settings (the
            message names each setting that differs), or a line other than the
            last is unreadable. The file is not changed.
    """
    if not output.exists():
        return 0
    raw = output.read_bytes()
    lines = raw.split(b"\n")
    last = lines.pop()  # the bytes after the last newline: b"" unless the last write was cut short
    unterminated = bool(last) and _parses(last)
    if unterminated:
        lines.append(last)
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            raise ValueError(f"{output}:{number} is not a JSON line; it is not an output of this job. Remove it or choose another --output") from None
        _check_line(output, number, record, items, settings)
    if unterminated:
        with open(output, "ab") as handle:
            handle.write(b"\n")
    elif last:
        logger.warning("%s: dropping a torn last line (%d bytes) left by an interrupted job", output, len(last))
        with open(output, "r+b") as handle:
            handle.truncate(len(raw) - len(last))
    return len(lines)


def check_output(output: Path) -> None:
    """Refuse an ``output`` that a job may not append to or replace: anything but a
    missing file, an empty file, or a file whose first line is a job's output line.

    Raises:
        ValueError: ``output`` is a folder, or a file of something else (never touched).
    """
    if not output.exists():
        return
    if not output.is_file():
        raise ValueError(f"{output} is not a file; choose another --output")
    with open(output, "rb") as handle:
        first = handle.readline()
    try:
        record = json.loads(first) if first.strip() else {"input_sha256": None}
    except ValueError:
        record = None
    if not isinstance(record, dict) or "input_sha256" not in record:
        raise ValueError(f"{output} is not the output of a generation job; not touching it. Choose another --output")


@contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold ``output`` for one job (checked first by :func:`check_output`): a second job writing the
    same file, in another process or this one, is refused at once instead of interleaving its lines.

    The lock is an exclusive ``flock`` on the output file itself, which keeps its inode for the
    whole job (:func:`run_job` appends, :func:`clear_output` and a resume truncate in place). A
    missing output is created empty to be locked, and removed again if the job leaves it empty.
    The lock goes with the process: a killed job leaves none behind.

    Raises:
        ValueError: ``output`` is not a job's output (:func:`check_output`), cannot be opened, or
            another job holds it.
    """
    check_output(output)
    if fcntl is None:  # pragma: no cover - no flock on this platform: jobs are not serialised
        yield
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    while True:
        created = True
        try:
            try:
                fd = os.open(output, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            except FileExistsError:
                created = False
                fd = os.open(output, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as err:
            raise ValueError(f"cannot open {output} for writing ({err.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(
                f"{output} is being written by another nest generate job; wait for it to end, or choose another --output"
            ) from None
        if _names(output, fd):
            break
        os.close(fd)  # the job before removed the file it had left empty: lock the one there now
    try:
        yield
    finally:
        if created and os.fstat(fd).st_size == 0:
            output.unlink(missing_ok=True)  # still locked: a job waiting on this file sees it gone and starts afresh
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` names the file open as ``fd``."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False


def clear_output(output: Path) -> None:
    """Empty ``output`` for a fresh job, after :func:`check_output`; a missing file is fine.

    Raises:
        ValueError: as :func:`check_output`.
    """
    check_output(output)
    if output.exists():
        output.write_bytes(b"")


def run_job(
    items: Sequence[JobItem], output: Path, run_chunks: ChunkRunner, *, settings: Mapping[str, Any], chunk_size: int,
    restart: bool = False,
) -> int:
    """Generate every item ``output`` does not hold yet, appending outputs in input order.

    Args:
        run_chunks: generates chunks (in-process: :func:`in_process_runner`;
            on Ray: :func:`nest_integrations.index.distributed.ray_generator`).
        settings: what decides an output besides the item (:func:`job_settings`),
            written on every line and checked on resume.
        chunk_size: items per chunk: per batched-decoder call, and per Ray task.
        restart: replace an earlier job's output instead of resuming it
            (:func:`clear_output`: never a file that is not a job's output).

    Returns:
        The number of items generated now (0 when ``output`` was complete).

    Raises:
        ValueError: ``chunk_size`` < 1, or ``output`` holds outputs of another
            job or other settings (see :func:`finished_items`), or with
            ``restart`` is not a job's output.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if restart:
        clear_output(output)
    done = finished_items(output, items, settings)
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
                    record = {"id": item.id, "line": item.line, "input_sha256": item.sha256, "settings": dict(settings), **out}
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
