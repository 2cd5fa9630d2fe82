"""Markdown documentation corpora: the Fastify web framework's reference docs, and
the Pino logger's API docs as a second domain.

Users keep documentation as Markdown files full of markup a reader never
quotes: HTML anchors (``<a id="x"></a>``), link-reference definitions
(``[1]: https://...``), tables of contents, code fences. Two sets of such files
(:data:`MARKDOWN_DOCS_SETS`), each bundled unmodified with its licence and a
``SOURCE.md`` and read as ``nest index build`` reads a folder (one passage per
file, id = file name):

* ``"fastify"`` -- 14 files of ``docs/Reference/`` of the npm package
  ``fastify@5.12.8`` (MIT) under ``data/fastify-docs/``, :func:`fastify_documents`;
  guides and references with prose sections;
* ``"pino"`` -- the whole ``docs/`` folder (14 files) of the npm package
  ``pino@10.4.0`` (MIT) under ``data/pino-docs/``, :func:`pino_documents`; an
  API reference with a heading per function or option
  (``### `logger.child(bindings, [options]) => logger```), so that questions
  tuned on one project's layout are checked on another's.

Three passage views of the same documents (:func:`markdown_passages`), the
chunkings a user of each entry point gets by default:

* ``"cli"`` -- :func:`nest_integrations.corpus.chunking.chunk_passages` at
  :data:`~nest_integrations.corpus.chunking.DEFAULT_CHUNK_TOKENS` tokens of the default
  LM, what ``nest index build`` does to a folder of Markdown files;
* ``"splitter"`` -- LangChain's ``RecursiveCharacterTextSplitter()`` (4,000
  characters, 200 overlap, ``add_start_index=True``), see
  :func:`~.docs_corpus.docs_splitter_chunks`;
* ``"sentence"`` -- LlamaIndex's ``SentenceSplitter()`` (its defaults: 1,024
  tokens of its own tokenizer, 200 overlap), :func:`sentence_splitter_chunks`.

Every chunk keeps ``doc_id`` = the file name and ``doc_char_start`` = its
offset in the file, so ``doc.text[p.doc_char_start:p.doc_char_end] == p.text``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from nest_integrations import Passage, load_documents
from nest_integrations.corpus.chunking import DEFAULT_CHUNK_TOKENS, chunk_passages

__all__ = [
    "FASTIFY_DOCS_DIR",
    "FASTIFY_QA_PATH",
    "FASTIFY_VERSION",
    "MARKDOWN_CHUNKINGS",
    "MARKDOWN_DOCS_SETS",
    "PINO_DOCS_DIR",
    "PINO_QA_PATH",
    "PINO_VERSION",
    "fastify_documents",
    "markdown_passages",
    "pino_documents",
    "sentence_splitter_chunks",
]

logger = logging.getLogger(__name__)

_DATA = Path(__file__).with_name("data")

FASTIFY_VERSION = "5.12.8"
"""The npm package version the bundled files were copied from."""

FASTIFY_DOCS_DIR = _DATA / "fastify-docs" / "Reference"
"""The bundled Markdown files (``SOURCE.md`` and ``LICENSE`` sit one folder up, outside the corpus)."""

FASTIFY_QA_PATH = _DATA / "fastify_qa.jsonl"
"""Hand-written questions about :data:`FASTIFY_DOCS_DIR`, one JSON object a line:
``{"id", "question", "answers", "doc", "kind", "messages"?, "unanswerable"?}``
(read by :func:`~.tasks.markdown_docs_items`; every answer string occurs in its ``doc``, tested)."""

PINO_VERSION = "10.4.0"
"""The npm package version the bundled Pino files were copied from."""

PINO_DOCS_DIR = _DATA / "pino-docs" / "docs"
"""The bundled Pino Markdown files (``SOURCE.md`` and ``LICENSE`` sit one folder up, outside the corpus)."""

PINO_QA_PATH = _DATA / "pino_qa.jsonl"
"""Hand-written questions about :data:`PINO_DOCS_DIR`, in the format of :data:`FASTIFY_QA_PATH`
(read by :func:`~.tasks.markdown_docs_pino_items`; every answer string occurs in its ``doc``, tested)."""

MARKDOWN_DOCS_SETS: tuple[str, ...] = ("fastify", "pino")
"""The bundled documentation sets :func:`markdown_passages` cuts (see the module docstring)."""

MARKDOWN_CHUNKINGS: tuple[str, ...] = ("cli", "splitter", "sentence")
"""Passage views of :func:`markdown_passages`: ``nest index build``'s chunks, LangChain's
default splitter's, LlamaIndex's default ``SentenceSplitter``'s."""


def _package_documents(folder: Path, package: str) -> list[Passage]:
    """The Markdown files of ``folder`` as whole documents (:func:`load_documents`), sorted
    by file name, each with ``metadata["package"] = package`` (``"name@version"``). Not ``source``:
    LangChain's loaders name a document's file there, and citations and an abstention's "see also"
    name a document by it first (``decoding.output.DOCUMENT_FIELDS``), so every file would read as
    the package's one name, and a cited span would find no lines."""
    return [replace(doc, metadata={**doc.metadata, "package": package}) for doc in load_documents(folder)]


def fastify_documents() -> list[Passage]:
    """The bundled Fastify reference files as whole documents, sorted by file name.

    Returns:
        One :class:`Passage` per file: ``id`` = file name (``"Reply.md"``),
        ``title`` = stem, text verbatim; metadata ``{"path", "package":
        "fastify@<version>"}``.
    """
    return _package_documents(FASTIFY_DOCS_DIR, f"fastify@{FASTIFY_VERSION}")


def pino_documents() -> list[Passage]:
    """The bundled Pino docs as whole documents, sorted by file name.

    Returns:
        One :class:`Passage` per file: ``id`` = file name (``"api.md"``),
        ``title`` = stem, text verbatim; metadata ``{"path", "package":
        "pino@<version>"}``.
    """
    return _package_documents(PINO_DOCS_DIR, f"pino@{PINO_VERSION}")


def sentence_splitter_chunks(documents: Sequence[Passage]) -> list[Passage]:
    """The documents cut by LlamaIndex's default ``SentenceSplitter()``.

    Returns:
        Passages ``f"{doc}#{i}"`` with the document's title and metadata,
        ``doc_id`` = the document id and ``doc_char_start`` from the node's
        ``start_char_idx``.

    Raises:
        ValueError: if a node's offsets do not give back its text verbatim
            (the splitter normalised the text, so spans could not be attributed).
    """
    from llama_index.core import Document
    from llama_index.core.node_parser import SentenceSplitter

    splitter = SentenceSplitter()
    chunks = []
    for doc in documents:
        nodes = splitter.get_nodes_from_documents([Document(text=doc.text, id_=doc.id)])
        for i, node in enumerate(nodes):
            start, text = node.start_char_idx, node.get_content()
            if start is None or doc.text[start : start + len(text)] != text:
                raise ValueError(f"SentenceSplitter lost the offset of chunk {i} of {doc.id!r}")
            chunks.append(
                Passage(
                    id=f"{doc.id}#{i}",
                    text=text,
                    title=doc.title,
                    metadata=dict(doc.metadata),
                    doc_id=doc.id,
                    doc_char_start=doc.doc_char_start + start,
                )
            )
    return chunks


def markdown_passages(chunking: str = "cli", docs_set: str = "fastify") -> list[Passage]:
    """The ``docs_set`` corpus (Fastify's by default) as passages to index, cut as
    ``chunking`` says (see the module docstring).

    Raises:
        ValueError: for a ``chunking`` not in :data:`MARKDOWN_CHUNKINGS` or a
            ``docs_set`` not in :data:`MARKDOWN_DOCS_SETS`.
    """
    if chunking not in MARKDOWN_CHUNKINGS:
        raise ValueError(f"unknown markdown-docs chunking {chunking!r}; choose from {MARKDOWN_CHUNKINGS}")
    if docs_set not in MARKDOWN_DOCS_SETS:
        raise ValueError(f"unknown Markdown docs set {docs_set!r}; choose from {MARKDOWN_DOCS_SETS}")
    documents = fastify_documents() if docs_set == "fastify" else pino_documents()
    if chunking == "splitter":
        from .docs_corpus import docs_splitter_chunks

        return docs_splitter_chunks(documents)
    if chunking == "sentence":
        return sentence_splitter_chunks(documents)
    from transformers import AutoTokenizer

    from nest_integrations.model.lm import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    logger.debug("chunking %d Markdown files at %d tokens", len(documents), DEFAULT_CHUNK_TOKENS)
    return chunk_passages(documents, max_tokens=DEFAULT_CHUNK_TOKENS, tokenizer=tokenizer)
