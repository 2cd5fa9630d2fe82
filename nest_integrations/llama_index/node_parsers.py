"""A LlamaIndex node parser that cuts Markdown along its sections, with exact offsets.

LlamaIndex's ``MarkdownNodeParser`` splits at every heading with no size
budget, rewrites the heading lines it keeps, and finds each node's
``start_char_idx`` by searching the document for the node's text (which the
rewrite can make fail); ``SentenceSplitter`` keeps offsets but cuts through
code blocks. :class:`MarkdownSectionNodeParser` is a thin adapter over
:func:`nest_integrations.corpus.chunking.section_chunks`, the chunking ``nest index
build`` uses for Markdown.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

from llama_index.core.bridge.pydantic import Field
from llama_index.core.node_parser.interface import NodeParser
from llama_index.core.node_parser.node_utils import build_nodes_from_splits
from llama_index.core.schema import BaseNode, Document, MetadataMode
from llama_index.core.utils import get_tqdm_iterable

from nest_integrations.corpus.chunking import section_chunks
from nest_integrations.decoding.locations import START_LINE_FIELD


class MarkdownSectionNodeParser(NodeParser):
    """Markdown nodes along sections, as :func:`~nest_integrations.corpus.chunking.section_chunks` cuts them
    (reStructuredText along its titles the same way).

    A node's ``start_char_idx`` / ``end_char_idx`` delimit its exact text in
    the source document (offsets of an input node cut from a document add
    up); ``metadata["heading_path"]`` lists the headings it sits under and
    ``metadata["start_line"]`` is the 1-based line of the input node's text it
    starts on (citations give line ranges from it when the document's file
    cannot be read; kept out of the embedded and LLM texts).
    """

    chunk_size: int = Field(
        default=4000,
        gt=0,
        description="Budget per node in length_function units (characters by default). Smaller nodes retrieve "
        "more precisely; larger ones give the token datastore more context.",
    )
    length_function: Callable[[str], int] = Field(
        default=len,
        exclude=True,
        description="str -> size, e.g. a tokenizer's token count; characters by default.",
    )

    @classmethod
    def class_name(cls) -> str:
        return "MarkdownSectionNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False, **kwargs: Any) -> List[BaseNode]:
        parsed: List[BaseNode] = []
        for node in get_tqdm_iterable(nodes, show_progress, "Parsing nodes"):
            text = node.get_content(metadata_mode=MetadataMode.NONE)
            base = getattr(node, "start_char_idx", None) or 0
            # The input's first line: 1 for a whole document; unknown for a piece cut without one.
            first_line = node.metadata.get(START_LINE_FIELD, 1 if base == 0 else None)
            chunks = section_chunks(text, max_tokens=self.chunk_size, tokenizer=self.length_function)
            built = build_nodes_from_splits([text[c.start : c.end] for c in chunks], node, id_func=self.id_func)
            for child, chunk in zip(built, chunks):
                child.start_char_idx, child.end_char_idx = base + chunk.start, base + chunk.end
                child.metadata["heading_path"] = list(chunk.heading_path)
                if first_line is None:
                    continue
                child.metadata[START_LINE_FIELD] = first_line + text.count("\n", 0, chunk.start)
                # New lists: the children may share their parent's.
                child.excluded_embed_metadata_keys = list(dict.fromkeys([*child.excluded_embed_metadata_keys, START_LINE_FIELD]))
                child.excluded_llm_metadata_keys = list(dict.fromkeys([*child.excluded_llm_metadata_keys, START_LINE_FIELD]))
            parsed.extend(built)
        return parsed

    def _postprocess_parsed_nodes(self, nodes: List[BaseNode], parent_doc_map: Dict[str, Document]) -> List[BaseNode]:
        """The base class's relationships and metadata, keeping the exact offsets (it would
        search each node's text in its document and take the first match at or after the previous)."""
        offsets = [(getattr(n, "start_char_idx", None), getattr(n, "end_char_idx", None)) for n in nodes]
        nodes = super()._postprocess_parsed_nodes(nodes, parent_doc_map)
        for node, (start, end) in zip(nodes, offsets):
            node.start_char_idx, node.end_char_idx = start, end  # type: ignore[attr-defined]
        return nodes
