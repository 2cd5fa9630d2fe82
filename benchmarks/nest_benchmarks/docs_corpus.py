"""A technical-documentation corpus: the docstrings of standard-library modules.

One document per module (:data:`DOCS_MODULES`): the title and id are the module
name and the text is the module's own docstring followed by every public
member's docstring, each headed by its name and signature (``loads(s, *,
cls=None, ...)``); public methods of public classes follow their class as
``Class.method(...)``. Docstrings are read with :func:`inspect.getdoc`, so the
corpus is whatever the running Python ships (it is built offline, in about a
second, and not cached).

Two passage views of the same documents (:func:`docs_passages`):

* ``"cli"`` -- what ``nest index build`` makes of a folder of these documents
  with its default settings: :func:`nest_integrations.corpus.chunking.chunk_passages`
  at :data:`~nest_integrations.corpus.chunking.DEFAULT_CHUNK_TOKENS` tokens of the
  default LM;
* ``"splitter"`` (:func:`docs_splitter_chunks`) -- the documents cut the way
  the integrations' users cut them by default: LangChain's
  ``RecursiveCharacterTextSplitter()`` (4,000 characters, 200 overlap,
  ``add_start_index=True``) when ``langchain_text_splitters`` is installed,
  else :func:`nest_integrations.corpus.chunking.chunk_passages` (its defaults).

Every chunk keeps ``doc_id`` = the module name and ``doc_char_start`` = its
offset in the document.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import platform
import re
from collections.abc import Sequence

from nest_integrations import Passage
from nest_integrations.corpus.chunking import DEFAULT_CHUNK_TOKENS, chunk_passages

__all__ = [
    "DOCS_CHUNKINGS",
    "DOCS_MODULES",
    "DOCS_SOURCE",
    "docs_corpus",
    "docs_passages",
    "docs_splitter_chunks",
    "module_document",
]

logger = logging.getLogger(__name__)

DOCS_SOURCE = "python-stdlib-docstrings"
_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+>")

DOCS_MODULES: tuple[str, ...] = (
    "argparse", "bisect", "collections", "csv", "datetime", "functools", "heapq", "itertools",
    "json", "math", "os.path", "pathlib", "random", "re", "shutil", "statistics", "string",
    "subprocess", "textwrap",
)
"""Modules of the corpus, one document each."""

DOCS_CHUNKINGS: tuple[str, ...] = ("cli", "splitter")
"""Passage views of :func:`docs_passages`: the CLI's default chunks or the integrations' default chunks."""


def _signature(member: object) -> str:
    """``(params)`` of a callable as :func:`inspect.signature` shows it, or ``""``
    when it has none (constants, some builtins). Memory addresses in default
    values (``<function copy2 at 0x7f...>``) are dropped so the text is the same
    in every process."""
    try:
        signature = str(inspect.signature(member))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    return _ADDRESS_RE.sub(">", signature)


def _public_names(module: object) -> list[str]:
    """The module's public names: ``__all__`` when it has one, else the names
    without a leading underscore that are not submodules, in sorted order."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))]
    return sorted(n for n in names if hasattr(module, n))


def _section(heading: str, member: object) -> str | None:
    """``"heading(signature)\\n docstring"`` for a member with a docstring of its own, else None.

    Members whose docstring is inherited from a builtin type (an int constant's
    ``int`` docstring) carry no information and are skipped.
    """
    doc = inspect.getdoc(member)
    if not doc or (not callable(member) and doc == inspect.getdoc(type(member))):
        return None
    return f"{heading}{_signature(member) if callable(member) else ''}\n{doc}"


def _class_sections(name: str, cls: type) -> list[str]:
    """Sections of a class's public methods and properties defined on the class itself."""
    sections = []
    for attr, value in sorted(vars(cls).items()):
        if attr.startswith("_"):
            continue
        member = value.fget if isinstance(value, property) else getattr(cls, attr, value)
        if callable(member) or isinstance(value, property):
            section = _section(f"{name}.{attr}", member)
            if section:
                sections.append(section)
    return sections


def module_document(module_name: str) -> Passage:
    """One module's documentation as a :class:`Passage`.

    Args:
        module_name: an importable module (``"os.path"``).

    Returns:
        ``Passage(id=title=module_name, text=...)`` whose text is the module
        docstring, then one section per public member (``name(signature)`` on
        its own line, then its docstring), sections separated by a blank line;
        metadata ``{"source": DOCS_SOURCE, "python": version}``.

    Raises:
        ValueError: if the module cannot be imported or has no documentation.
    """
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import {module_name!r}: {err}") from err
    sections = [inspect.getdoc(module) or ""]
    for name in _public_names(module):
        member = getattr(module, name)
        section = _section(name, member)
        if section:
            sections.append(section)
        if inspect.isclass(member) and member.__module__ == module.__name__:
            sections.extend(_class_sections(name, member))
    text = "\n\n".join(s for s in sections if s)
    if not text:
        raise ValueError(f"module {module_name!r} has no docstrings")
    return Passage(
        id=module_name,
        text=text,
        title=module_name,
        metadata={"source": DOCS_SOURCE, "python": platform.python_version()},
    )


def docs_corpus(modules: Sequence[str] = DOCS_MODULES) -> list[Passage]:
    """Whole documents, one per module of ``modules`` (see :func:`module_document`).

    Raises:
        ValueError: an empty or repeated module list, or a module that cannot be documented.
    """
    if not modules:
        raise ValueError("docs_corpus needs at least one module")
    if len(set(modules)) != len(modules):
        raise ValueError(f"modules repeat: {list(modules)}")
    return [module_document(name) for name in modules]


def _langchain_chunks(documents: Sequence[Passage]) -> list[Passage]:
    """``RecursiveCharacterTextSplitter(add_start_index=True)`` chunks as passages
    ``f"{doc}#{i}"`` with ``doc_id`` and ``doc_char_start`` from ``start_index``."""
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(add_start_index=True)
    chunks = []
    for doc in documents:
        pieces = splitter.create_documents([doc.text])
        for i, piece in enumerate(pieces):
            start = piece.metadata["start_index"]
            if start < 0 or doc.text[start : start + len(piece.page_content)] != piece.page_content:
                raise ValueError(f"the splitter lost the offset of chunk {i} of {doc.id!r}")
            chunks.append(
                Passage(
                    id=f"{doc.id}#{i}",
                    text=piece.page_content,
                    title=doc.title,
                    metadata=dict(doc.metadata),
                    doc_id=doc.id,
                    doc_char_start=start,
                )
            )
    return chunks


def docs_splitter_chunks(documents: Sequence[Passage] | None = None) -> list[Passage]:
    """The documents chunked as the integrations' users chunk them by default.

    Args:
        documents: whole documents; defaults to :func:`docs_corpus`.

    Returns:
        With ``langchain_text_splitters`` installed, the chunks of
        ``RecursiveCharacterTextSplitter(add_start_index=True)`` (its defaults:
        4,000 characters, 200 overlap) as passages ``f"{module}#{i}"``; without
        it, :func:`nest_integrations.corpus.chunking.chunk_passages` with its defaults.
        Either way ``doc_id`` is the module name and
        ``doc.text[p.doc_char_start:p.doc_char_end] == p.text``.
    """
    documents = docs_corpus() if documents is None else list(documents)
    try:
        import langchain_text_splitters  # noqa: F401
    except ImportError:
        logger.info("langchain_text_splitters is not installed; chunking with chunk_passages")
        return chunk_passages(documents)
    return _langchain_chunks(documents)


def docs_passages(chunking: str = "cli") -> list[Passage]:
    """The corpus as passages to index: ``"cli"`` (what ``nest index build`` keeps
    of a folder of these documents by default) or ``"splitter"``
    (:func:`docs_splitter_chunks`, the integrations' default chunking).

    Raises:
        ValueError: for another ``chunking``.
    """
    if chunking not in DOCS_CHUNKINGS:
        raise ValueError(f"unknown docs chunking {chunking!r}; choose from {DOCS_CHUNKINGS}")
    documents = docs_corpus()
    if chunking == "splitter":
        return docs_splitter_chunks(documents)
    from transformers import AutoTokenizer

    from nest_integrations.model.lm import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    return chunk_passages(documents, max_tokens=DEFAULT_CHUNK_TOKENS, tokenizer=tokenizer)
