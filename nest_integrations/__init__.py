"""NEST (Nearest Neighbor Speculative Decoding) for LangChain and LlamaIndex.

The names a user needs are importable from the package itself::

    from nest_integrations import NestIndex, load_lm, load_wikipedia_summaries

    index = NestIndex.build(load_wikipedia_summaries(topic="People"), load_lm())
    out = index.decoder().generate("Tell me a bio of Ada Lovelace.", query="Ada Lovelace")
    print(out.text, out.attribution_ratio)

* Build and decode: :class:`NestIndex` (corpus, retriever and token datastore
  saved as one folder), :class:`NestDecoder` (generation, streaming, batching,
  scoring), :class:`NestConfig` (every hyperparameter), :func:`load_lm`, and
  :func:`store_decoder` (a decoder over a vector store you already have).
* Corpora: :class:`Passage`, :func:`load_corpus`, :func:`load_documents`,
  :func:`load_wikipedia_summaries`.
* The output contract: :class:`NestOutput`, its :class:`Span` s and
  :class:`GenerationStats`, the :class:`StreamChunk` s of a stream, and the
  renderers :func:`render_markdown`, :func:`render_html`, :func:`render_terminal`.

The integrations are subpackages with their own extras:
:mod:`nest_integrations.langchain` and :mod:`nest_integrations.llama_index`.

Every name is imported on first use (PEP 562), so ``import nest_integrations``
loads neither torch nor transformers: a command-line tool or an integration
that only needs a submodule pays nothing for the rest.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
"""Type checkers read it as True (the typing spec's idiom); importing ``typing`` for it would
double the cost of ``import nest_integrations``."""
if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see; at run time __getattr__ imports
    from .core.config import NestConfig
    from .corpus.loaders import load_corpus, load_documents, load_wikipedia_summaries
    from .corpus.passages import Passage
    from .decoding.decoder import NestDecoder
    from .decoding.generation import StreamChunk
    from .decoding.output import GenerationStats, NestOutput, Span
    from .decoding.rendering import render_html, render_markdown, render_terminal
    from .index.foreign_store import store_decoder
    from .index.nest_index import NestIndex
    from .model.lm import LoadedLM, load_lm

_EXPORTS = {
    "NestConfig": "core.config",
    "load_corpus": "corpus.loaders",
    "load_documents": "corpus.loaders",
    "load_wikipedia_summaries": "corpus.loaders",
    "Passage": "corpus.passages",
    "NestDecoder": "decoding.decoder",
    "StreamChunk": "decoding.generation",
    "GenerationStats": "decoding.output",
    "NestOutput": "decoding.output",
    "Span": "decoding.output",
    "render_html": "decoding.rendering",
    "render_markdown": "decoding.rendering",
    "render_terminal": "decoding.rendering",
    "store_decoder": "index.foreign_store",
    "NestIndex": "index.nest_index",
    "LoadedLM": "model.lm",
    "load_lm": "model.lm",
}
"""Public name -> the submodule (relative to this package) that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """Import a public name's submodule on first access and cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later accesses skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
