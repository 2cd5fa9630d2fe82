"""Attribution records: which characters of a generation came from which corpus passage.

:class:`NestOutput` is the output contract (design.md): ``spans`` tile ``text``
exactly, a copied span's text is verbatim its source passage (chunk) text between
``source.chunk_char_start`` and ``source.chunk_char_end``, and ``stats`` says
what the generation cost.

Every copied span also says where it sits in its *document*
(:class:`SourceLocation`, ``span.source.location``): the file or document
name, the character range in the document and the line range, so a reader can
open the file at the cited lines. :func:`cited_documents` lists the documents
an output copied from, once each, numbered in order of first use; the
renderers (:func:`render_markdown`, :func:`render_html`,
:func:`render_terminal`) and the integrations' citations all number them so.

Offsets in the chunk are named ``chunk_char_start`` / ``chunk_char_end``; until
the next release :class:`SpanSource` also answers to the old names
``char_start`` / ``char_end`` (a ``DeprecationWarning``), and the JSON of an
output keeps them next to the new keys (:data:`DEPRECATED_CHUNK_KEYS`).
"""

from __future__ import annotations

import functools
import html
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Optional, Sequence

from pydantic import AliasChoices, BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from nest_integrations.corpus.passages import Passage

if TYPE_CHECKING:  # pragma: no cover
    from markdown_it import MarkdownIt
    from markdown_it.token import Token


class SourceRef(BaseModel):
    """A passage a generation drew on."""

    id: str = Field(description="The passage's id (Passage.id: a chunk's or node's id in the integrations).")
    title: str = Field("", description="The passage's title ('' when it has none).")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="The passage's metadata, as its loader, splitter or store gave it."
    )


# --------------------------------------------------------------------------- locations
DOCUMENT_FIELDS: tuple[str, ...] = ("source", "file_path", "path", "file_name", "doc_id")
"""Metadata fields naming a passage's document, in order of preference: LangChain loaders write
``source``, LlamaIndex readers ``file_path`` and ``file_name``, ``nest index build`` ``path``."""

START_LINE_FIELD = "start_line"
"""Metadata field a splitter may set: the 1-based line of the document its chunk starts on
(the integrations' Markdown splitters set it next to the chunk's character offset)."""

MAX_DOCUMENT_BYTES = 32 * 2**20
"""Largest document file read to check offsets and count lines (bigger ones: lines unknown)."""


class SourceLocation(BaseModel):
    """Where cited text sits in its document: what a reader needs to find it.

    Characters are 0-based Python string offsets, ``char_end`` exclusive. Lines
    are 1-based and inclusive: the lines the cited characters sit on (a
    trailing newline belongs to the line it ends). A field is None when it is
    not known; nothing is guessed.
    """

    document: str = Field(
        description="The document as its user named it: the file path or the source / file_path / path / "
        "file_name / doc_id metadata (DOCUMENT_FIELDS), else the document or passage id."
    )
    document_id: str = Field(
        description="What the character offsets index: the document name when its file was read, else the "
        "passage's doc_id (the passage id for a whole-document passage). Sources are grouped by it."
    )
    char_start: Optional[int] = Field(None, ge=0, description="Start offset in the document (None: unknown).")
    char_end: Optional[int] = Field(None, ge=0, description="End offset (exclusive) in the document (None: unknown).")
    line_start: Optional[int] = Field(
        None, ge=1, description="First line (1-based) of the cited text; None when the document text is unknown."
    )
    line_end: Optional[int] = Field(None, ge=1, description="Last line (1-based, inclusive) of the cited text.")

    def cut(self, text: str, lo: int, hi: int) -> "SourceLocation":
        """The location of ``text[lo:hi]``, where ``text`` is the cited text this location is of."""
        update: dict[str, Any] = {}
        if self.char_start is not None:
            update.update(char_start=self.char_start + lo, char_end=self.char_start + hi)
        if self.line_start is not None:
            update.update(line_start=self.line_start + text.count("\n", 0, lo), line_end=self.line_start + text.count("\n", 0, max(hi - 1, lo)))
        return self.model_copy(update=update)

    def joined(self, following: "SourceLocation") -> "SourceLocation":
        """This location extended to the end of ``following``, the text right after it in the same document."""
        chars = (self.char_start, following.char_end)
        lines = (self.line_start, following.line_end)
        return self.model_copy(
            update={
                "char_start": None if None in chars else chars[0],
                "char_end": None if None in chars else chars[1],
                "line_start": None if None in lines else lines[0],
                "line_end": None if None in lines else lines[1],
            }
        )

    @property
    def lines(self) -> str:
        """``"12"``, ``"12-14"``, or ``""`` when the lines are unknown."""
        if self.line_start is None or self.line_end is None:
            return ""
        return str(self.line_start) if self.line_end == self.line_start else f"{self.line_start}-{self.line_end}"

    def label(self) -> str:
        """``document:lines`` (``docs/os.md:12-14``), or the document alone when the lines are unknown."""
        return f"{self.document}:{self.lines}" if self.lines else self.document

    def describe(self) -> str:
        """The ranges in words, without the document: ``"lines 12-14, chars 340-420"``."""
        if self.char_start is None or self.char_end is None:
            return "position in the document unknown"
        chars = f"chars {self.char_start}-{self.char_end}"
        if not self.lines:
            return f"{chars}, lines unknown (document text not available)"
        return f"{'line' if self.line_start == self.line_end else 'lines'} {self.lines}, {chars}"


def document_name(metadata: Mapping[str, Any], fallback: str) -> str:
    """The first non-blank string among ``metadata``'s :data:`DOCUMENT_FIELDS`, else ``fallback``."""
    for key in DOCUMENT_FIELDS:
        value = metadata.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return fallback


def document_text(name: str) -> Optional[str]:
    """The text of the file ``name`` names (a path, relative to the working directory or absolute),
    read as loaders read it (UTF-8, universal newlines); None when it is no readable UTF-8 file
    of at most :data:`MAX_DOCUMENT_BYTES`. Reads are cached while the file is unchanged."""
    try:
        info = Path(name).stat()
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DOCUMENT_BYTES:
        return None
    return _read_document(str(Path(name).resolve()), info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=32)
def _read_document(path: str, mtime_ns: int, size: int) -> Optional[str]:
    """The cached body of :func:`document_text` (``mtime_ns`` and ``size`` only key the cache)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _offset_in(document: str, passage: Passage) -> Optional[int]:
    """Where ``passage.text`` sits in ``document``: at its claimed ``doc_char_start`` when it is
    there, else at its only occurrence; None when it is absent or ambiguous."""
    if document.startswith(passage.text, passage.doc_char_start):
        return passage.doc_char_start
    first = document.find(passage.text)
    if first < 0 or document.find(passage.text, first + 1) >= 0:
        return None
    return first


def _line_range(text: str, lo: int, hi: int, first_line: int) -> tuple[int, int]:
    """The 1-based lines of ``text[lo:hi]`` when ``text`` starts on line ``first_line``."""
    return first_line + text.count("\n", 0, lo), first_line + text.count("\n", 0, max(hi - 1, lo))


def locate(passage: Passage, char_start: int, char_end: int) -> SourceLocation:
    """Where ``passage.text[char_start:char_end]`` sits in its document.

    The document is named by :func:`document_name`. Its character offsets come
    from the passage's ``doc_char_start`` (a LangChain chunk's ``start_index``,
    a LlamaIndex node's ``start_char_idx``, a ``nest index build`` passage's own
    field); a passage without a ``doc_id`` is a whole document. Lines come from,
    in order:

    1. the document's file, when the name is a readable file holding the
       passage text at its offset (or only once: then that occurrence also
       fixes the offsets, e.g. for a chunk split without ``start_index``);
    2. the passage text itself, when the passage is the whole document;
    3. the chunk's :data:`START_LINE_FIELD` metadata plus the newlines before
       the cited text;

    else they are None (unknown).
    """
    name = document_name(passage.metadata, passage.doc_id or passage.id)
    text = document_text(name)
    offset = _offset_in(text, passage) if text is not None else None
    if text is not None and offset is not None:
        lines = _line_range(text, offset + char_start, offset + char_end, 1)
        return SourceLocation(
            document=name, document_id=name, char_start=offset + char_start, char_end=offset + char_end,
            line_start=lines[0], line_end=lines[1],
        )
    whole = passage.doc_id in ("", passage.id) and passage.doc_char_start == 0
    first_line = 1 if whole else passage.metadata.get(START_LINE_FIELD)
    known = isinstance(first_line, int) and not isinstance(first_line, bool) and first_line >= 1
    lines = _line_range(passage.text, char_start, char_end, first_line) if known else (None, None)
    return SourceLocation(
        document=name,
        document_id=passage.doc_id or passage.id,
        char_start=passage.doc_char_start + char_start,
        char_end=passage.doc_char_start + char_end,
        line_start=lines[0],
        line_end=lines[1],
    )


DEPRECATED_CHUNK_KEYS: dict[str, str] = {"char_start": "chunk_char_start", "char_end": "chunk_char_end"}
"""The old names of :class:`SpanSource`'s chunk offsets, deprecated, to the new ones. They read as
if they were document offsets, which they are not. Until the next release a span source still
reads them (from outputs saved before), answers to them as properties with a
``DeprecationWarning``, and writes them to its JSON next to the new keys."""


class SpanSource(SourceRef):
    """Where a copied span sits: in its chunk (character offsets into ``Passage.text``) and in its document.

    ``chunk_char_start`` / ``chunk_char_end`` index the chunk's own text; where
    the span sits in its file is ``location`` (``location.char_start``,
    ``location.line_start``, ...). The old names ``char_start`` / ``char_end``
    are deprecated (:data:`DEPRECATED_CHUNK_KEYS`).
    """

    chunk_char_start: int = Field(
        ge=0,
        validation_alias=AliasChoices("chunk_char_start", "char_start"),
        description="Start of the span in its chunk's text (Passage.text), 0-based: not a document offset "
        "(that is location.char_start). Read from the deprecated key char_start too.",
    )
    chunk_char_end: int = Field(
        ge=0,
        validation_alias=AliasChoices("chunk_char_end", "char_end"),
        description="End of the span (exclusive) in its chunk's text. Read from the deprecated key char_end too.",
    )
    location: SourceLocation = Field(
        description="The span's document, character range and line range in it (see locate). An output "
        "recorded without it reads back with the document named from the metadata and the ranges unknown."
    )

    @model_validator(mode="before")
    @classmethod
    def _unknown_location(cls, data: Any) -> Any:
        """Outputs saved before locations were recorded: the document from the metadata, no ranges."""
        if isinstance(data, dict) and data.get("location") is None:
            metadata = data.get("metadata") or {}
            name = document_name(metadata, str(data.get("id", "")))
            data = {**data, "location": SourceLocation(document=name, document_id=str(data.get("id", "")))}
        return data

    @model_serializer(mode="wrap")
    def _with_deprecated_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The fields, then the deprecated :data:`DEPRECATED_CHUNK_KEYS` with the same values, so
        readers of the old JSON keys keep working for one release."""
        data = handler(self)
        data.update({old: data[new] for old, new in DEPRECATED_CHUNK_KEYS.items() if new in data})
        return data

    @property
    def char_start(self) -> int:
        """Deprecated: :attr:`chunk_char_start` (an offset in the chunk; the document offset is
        ``location.char_start``). Removed in the next release."""
        _warn_deprecated("char_start")
        return self.chunk_char_start

    @property
    def char_end(self) -> int:
        """Deprecated: :attr:`chunk_char_end` (an offset in the chunk; the document offset is
        ``location.char_end``). Removed in the next release."""
        _warn_deprecated("char_end")
        return self.chunk_char_end


def _warn_deprecated(old: str) -> None:
    """Warn, at the caller's caller, that ``SpanSource.<old>`` is deprecated."""
    new = DEPRECATED_CHUNK_KEYS[old]
    warnings.warn(
        f"SpanSource.{old} is deprecated and will be removed in the next release: it is the offset in the chunk, "
        f"now named {new}; the offset in the document is location.{old}",
        DeprecationWarning,
        stacklevel=3,
    )


def chunk_offsets(source: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(chunk_char_start, chunk_char_end)`` of a span source in an output's JSON
    (``NestOutput.to_dict()``), from the deprecated keys for outputs saved before the rename.
    The values are returned as found (not checked)."""
    return source.get("chunk_char_start", source.get("char_start")), source.get("chunk_char_end", source.get("char_end"))


class Span(BaseModel):
    """A run of output characters ``text[start:end]``, copied from one passage or generated by the LM."""

    text: str = Field(description="The span's characters: text[start:end] of the output.")
    start: int = Field(ge=0, description="Start offset (0-based) in the output text.")
    end: int = Field(ge=0, description="End offset (exclusive) in the output text.")
    copied: bool = Field(description="Whether the span was copied verbatim from a passage (else the LM wrote it).")
    source: Optional[SpanSource] = Field(
        None,
        description="Where a copied span comes from: its chunk, its offsets there and its document location; "
        "None for LM text.",
    )


FinishReason = Literal["eos", "stop", "length", "source_end", "answered", "not_covered"]
FallbackReason = Literal["no_retriever", "nothing_retrieved", "nothing_relevant", "not_mentioned", "empty_datastore"]


class GenerationStats(BaseModel):
    """What a generation cost. ``forward_passes`` counts decoder LM calls (prefill included);
    datastore encoding is counted apart (``encode_passes``, zero when keys were cached).

    Times are seconds, each phase under its own name: ``calibration_s`` (a one-time alpha/tau
    fit this generation waited for, 0 when the index or store was calibrated before, as
    building one with an LM does), ``retrieval_s`` (first stage, relevance gate, answer
    windows), ``encode_s`` (keys of passages not encoded yet) and ``decode_s``; ``wall_s`` is
    the generation's whole time, all of these included. ``load_s`` is the one-time loading of
    the index and LM that the caller paid before it (the CLI's one-shot ``nest generate``
    sets it); it is not part of ``wall_s``."""

    new_tokens: int = Field(0, description="Tokens generated.")
    forward_passes: int = Field(0, description="Decoder LM forward passes, the prefill included.")
    encode_passes: int = Field(0, description="LM forward passes that encoded datastore keys (0 when they were cached).")
    encoded_passages: int = Field(0, description="Passages whose keys this generation encoded.")
    wall_s: float = Field(0.0, description="Seconds the whole generation took, every phase included.")
    retrieval_s: float = Field(0.0, description="Seconds of the first stage, the relevance gate and the answer windows.")
    encode_s: float = Field(0.0, description="Seconds of encoding the keys of passages not encoded yet.")
    decode_s: float = Field(0.0, description="Seconds of decoding.")
    calibration_s: float = Field(0.0, description="Seconds of an alpha/tau fit this generation waited for (0: none).")
    load_s: float = Field(0.0, description="Seconds of one-time loading (index, LM) paid before this generation (0: none).")
    prompt_tokens: int = Field(0, description="Tokens of the prompt the LM read (after the chat template).")
    prompt_truncated: bool = Field(
        False,
        description="Whether the prompt was cut to its last tokens (to fit NestConfig.max_prompt_tokens or the "
        "LM's context).",
    )
    finish_reason: Optional[FinishReason] = Field(
        None,
        description="Why the generation ended: the LM's end-of-sequence token, a stop string, max_new_tokens, "
        "copying reached the end of its source (NestConfig.stop_at_source_end), or the copied sentence "
        "answered a question and the source goes on to something else (NestConfig.answer_focus), or no retrieved "
        "passage answers the question and the text says so instead of the LM answering alone (NestConfig.fallback).",
    )
    copied_from_datastore: bool = Field(
        False, description="Whether the decoder had datastore entries to copy from (False: the LM wrote alone)."
    )
    fallback_reason: Optional[FallbackReason] = Field(
        None,
        description="Why a datastore mode generated with the LM alone: no retriever and no passages given, "
        "the first stage returned nothing, the relevance gate kept nothing, the question names something the "
        "corpus never mentions (nest_integrations.policy.mentions), or the kept passages hold no datastore "
        "entries. None when the decoder could copy (or the mode uses no datastore).",
    )
    gate_kept: int = Field(0, description="Retrieved passages the relevance gate let into the token datastore.")
    gate_retrieved: int = Field(0, description="Passages the first stage returned to the gate.")

    @property
    def tokens_per_forward(self) -> float:
        return tokens_per_decoding_forward(self.new_tokens, self.forward_passes)


def tokens_per_decoding_forward(new_tokens: int, forward_passes: int, generations: int = 1) -> float:
    """Generated tokens per *decoding* forward pass.

    Each generation's first forward (the prefill) reads the prompt and is not
    counted, so plain greedy decoding of n tokens gives n / (n - 1) ~ 1.0 and
    a span-copying step that accepts k tokens counts k. ``generations`` is the
    number of generations summed in ``new_tokens`` and ``forward_passes``.
    """
    return new_tokens / max(forward_passes - generations, 1)


class NestOutput(BaseModel):
    """One attributed generation (the CLI's ``--json`` and the integrations' metadata)."""

    text: str = Field(description="The generated text.")
    mode: str = Field(description="The decoding mode that wrote it: base, rag, knnlm, nest or ra_nest.")
    spans: list[Span] = Field(
        default_factory=list,
        description="Spans that tile the text in order, each copied from a passage or written by the LM.",
    )
    attribution_ratio: float = Field(0.0, description="Share of the generated tokens that were copied, in [0, 1].")
    mean_copied_span_tokens: float = Field(
        0.0, description="Mean length of a copied span, in tokens (0 when nothing was copied)."
    )
    sources: list[SourceRef] = Field(
        default_factory=list, description="The passages copied from, once each, in order of first use."
    )
    stats: GenerationStats = Field(default_factory=GenerationStats, description="What the generation cost, and why it ended.")

    @property
    def copied_spans(self) -> list[Span]:
        return [s for s in self.spans if s.copied]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class TokenRecord:
    """One generated token and, when copied, the passage position it came from."""

    token_id: int
    passage_index: Optional[int] = None
    position: Optional[int] = None

    @property
    def copied(self) -> bool:
        return self.passage_index is not None


def token_runs(records: Sequence[TokenRecord]) -> list[tuple[int, int]]:
    """Group token indices into runs ``[lo, hi)``: consecutive tokens copied from one
    passage at consecutive positions form a run; consecutive LM tokens form a run."""
    runs: list[tuple[int, int]] = []
    lo = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or not _continues(records[i - 1], records[i]):
            runs.append((lo, i))
            lo = i
    return runs if records else []


def _continues(prev: TokenRecord, cur: TokenRecord) -> bool:
    if prev.copied != cur.copied:
        return False
    if not cur.copied:
        return True
    return cur.passage_index == prev.passage_index and cur.position == (prev.position or 0) + 1


def build_spans(
    text: str,
    boundaries: Sequence[int],
    records: Sequence[TokenRecord],
    passages: Sequence[Passage],
    char_spans_of: Any,
) -> tuple[list[Span], list[int]]:
    """Spans tiling ``text`` from per-token records.

    Args:
        text: the decoded output (possibly cut at a stop string).
        boundaries: character offset in ``text`` where each token ends
            (``len(boundaries) == len(records)``; clipped to ``len(text)``).
        char_spans_of: ``passage_index -> int32 (L, 2)`` tiling char spans.

    Returns:
        The spans and, per span, its length in tokens. A run whose decoded text
        differs from its claimed source slice (a lossy tokenizer, or a cut at a
        stop string) is reported as LM text: a span is only called copied when
        it is verbatim.
    """
    spans: list[Span] = []
    lengths: list[int] = []
    for lo, hi in token_runs(records):
        start = min(boundaries[lo - 1], len(text)) if lo else 0
        end = min(boundaries[hi - 1], len(text))
        if end <= start:
            continue
        piece = text[start:end]
        first = records[lo]
        source = None
        if first.copied:
            passage = passages[first.passage_index]
            cs = char_spans_of(first.passage_index)
            c0, c1 = int(cs[first.position, 0]), int(cs[records[hi - 1].position, 1])
            if passage.text[c0:c1] == piece:
                source = SpanSource(
                    id=passage.id, title=passage.title, metadata=dict(passage.metadata), chunk_char_start=c0, chunk_char_end=c1,
                    location=locate(passage, c0, c1),
                )
        if spans and source is None and not spans[-1].copied:  # merge with the previous LM span
            prev = spans[-1]
            spans[-1] = Span(text=prev.text + piece, start=prev.start, end=end, copied=False)
            lengths[-1] += hi - lo
            continue
        spans.append(Span(text=piece, start=start, end=end, copied=source is not None, source=source))
        lengths.append(hi - lo)
    return spans, lengths


def summarize(spans: Sequence[Span], lengths: Sequence[int]) -> tuple[float, float, list[SourceRef]]:
    """(attribution ratio in tokens, mean copied span in tokens, distinct sources in order of use)."""
    total = sum(lengths)
    copied = [n for s, n in zip(spans, lengths) if s.copied]
    ratio = sum(copied) / total if total else 0.0
    mean_span = sum(copied) / len(copied) if copied else 0.0
    sources: dict[str, SourceRef] = {}
    for span in spans:
        if span.source is not None and span.source.id not in sources:
            sources[span.source.id] = SourceRef(id=span.source.id, title=span.source.title, metadata=span.source.metadata)
    return ratio, mean_span, list(sources.values())


def merge_spans(pieces: Iterable[Span]) -> list[Span]:
    """Join streamed span pieces back into whole spans.

    Adjacent LM pieces merge; adjacent copied pieces merge when they come from
    the same passage and continue each other in both the output and the source.
    Merging the chunks of a stream gives the spans of the non-streamed output.
    """
    merged: list[Span] = []
    for piece in pieces:
        if merged and _joins(merged[-1], piece):
            prev = merged[-1]
            source = None
            if prev.source is not None and piece.source is not None:
                source = prev.source.model_copy(
                    update={"chunk_char_end": piece.source.chunk_char_end, "location": prev.source.location.joined(piece.source.location)}
                )
            merged[-1] = Span(text=prev.text + piece.text, start=prev.start, end=piece.end, copied=prev.copied, source=source)
        else:
            merged.append(piece)
    return merged


def _joins(a: Span, b: Span) -> bool:
    if a.end != b.start or a.copied != b.copied:
        return False
    if not a.copied:
        return True
    assert a.source is not None and b.source is not None
    return a.source.id == b.source.id and a.source.chunk_char_end == b.source.chunk_char_start


def shift_spans(spans: Iterable[Span], lo: int, hi: int) -> list[Span]:
    """The parts of ``spans`` inside ``[lo, hi)`` (character offsets), cut where needed."""
    out = []
    for span in spans:
        a, b = max(span.start, lo), min(span.end, hi)
        if a >= b:
            continue
        source = None
        if span.source is not None:
            lo, hi = a - span.start, b - span.start
            source = span.source.model_copy(
                update={
                    "chunk_char_start": span.source.chunk_char_start + lo,
                    "chunk_char_end": span.source.chunk_char_start + hi,
                    "location": span.source.location.cut(span.text, lo, hi),
                }
            )
        out.append(Span(text=span.text[a - span.start : b - span.start], start=a, end=b, copied=span.copied, source=source))
    return out


# --------------------------------------------------------------------------- cited documents
class DocumentNumbers:
    """Numbers documents 1, 2, ... in order of first use: the ``n`` of a ``[n]`` marker.

    One instance numbers one answer; a stream feeds its spans as they come and
    gets the numbers of the whole answer (first use does not depend on what follows).
    """

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def number(self, location: SourceLocation) -> int:
        """The number of ``location``'s document (a new one gets the next number)."""
        return self._numbers.setdefault(location.document_id, len(self._numbers) + 1)


class CitedDocument(BaseModel):
    """One document an answer copied from, with every range it cites there."""

    number: int = Field(description="1-based, in order of first use in the answer: the n of its [n] markers.")
    document: str = Field(description="The document's name (SourceLocation.document).")
    document_id: str = Field(description="What its offsets index (SourceLocation.document_id).")
    title: str = Field("", description="The title of the first passage cited from it ('' when none).")
    locations: list[SourceLocation] = Field(
        default_factory=list, description="The cited ranges in order of use; adjacent ones joined, repeats left out."
    )

    @property
    def extra_title(self) -> str:
        """The title when it says something the document's name does not, else ``""``."""
        return self.title if self.title and self.title not in self.document else ""

    def ranges(self) -> str:
        """The cited ranges in words: ``lines 12-14, chars 340-420; line 20, chars 600-640``."""
        return "; ".join(location.describe() for location in self.locations)

    def describe(self) -> str:
        """``docs/os.md: lines 12-14, chars 340-420; ...``, with :attr:`extra_title` in
        parentheses after the name."""
        name = f"{self.document} ({self.extra_title})" if self.extra_title else self.document
        return f"{name}: {self.ranges()}"


def cited_documents(spans: Iterable[Span]) -> list[CitedDocument]:
    """The documents the copied ``spans`` cite, once each, numbered in order of first use."""
    numbers = DocumentNumbers()
    documents: dict[int, CitedDocument] = {}
    for span in spans:
        if not span.copied or span.source is None:
            continue
        location = span.source.location
        n = numbers.number(location)
        entry = documents.setdefault(
            n, CitedDocument(number=n, document=location.document, document_id=location.document_id, title=span.source.title)
        )
        last = entry.locations[-1] if entry.locations else None
        if last is not None and last.char_end is not None and last.char_end == location.char_start:
            entry.locations[-1] = last.joined(location)
        elif location not in entry.locations:
            entry.locations.append(location)
    return list(documents.values())


def source_listing(output: NestOutput) -> list[str]:
    """The sources of ``output`` as lines ``[n] document: ranges``, numbered in order of first use
    (what :func:`render_terminal` and the LangChain ``cite`` runnable print)."""
    return [f"[{doc.number}] {doc.describe()}" for doc in cited_documents(output.spans)]


MODEL_MARK = "[model]"
"""What every renderer puts after text the LM wrote itself, as ``[n]`` after copied text: a
reader must not take an invented line between two copies for a cited one."""

MODEL_NOTE = f"{MODEL_MARK} written by the language model, not copied from any source"
"""The line that explains :data:`MODEL_MARK` under an answer that has some."""


def model_written(output: NestOutput, span: Span) -> bool:
    """Whether ``span`` is text the LM wrote that reads as part of the answer: not copied, with
    a letter or digit (a comma or a line break between two copies is not marked), and not the
    abstention of an output that says nothing answers (``finish_reason`` ``"not_covered"``)."""
    return not span.copied and any(ch.isalnum() for ch in span.text) and output.stats.finish_reason != "not_covered"


def model_note(output: NestOutput) -> Optional[str]:
    """:data:`MODEL_NOTE` when ``output`` has text the LM wrote (:func:`model_written`), else None."""
    return MODEL_NOTE if any(model_written(output, span) for span in output.spans) else None


# --------------------------------------------------------------------------- Markdown layout
_BARE_FENCE = re.compile(r"^[ \t>]*(`{3,}|~{3,})[ \t]*$")


@functools.lru_cache(maxsize=1)
def _markdown_parser() -> "MarkdownIt":
    """CommonMark with tables, built once (parsing keeps no state in it)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table")


def _line_offsets(text: str) -> list[int]:
    """Offset of each line's first character, then ``len(text)``: a token's line map ``[a, b)`` is
    the characters ``[offsets[a], offsets[b])`` (indices clipped to the list)."""
    return [0, *(m.end() for m in re.finditer("\n", text)), len(text)]


def _chars(offsets: list[int], line_map: Sequence[int]) -> tuple[int, int]:
    """The character range ``[a, b)`` of a token's line map (see :func:`_line_offsets`)."""
    last = len(offsets) - 1
    return offsets[min(line_map[0], last)], offsets[min(line_map[1], last)]


def _container_indent(prefix: str) -> str:
    """What a line needs before it to stay in the list items and quotes a line starting with
    ``prefix`` sits in: the quote marks kept, list markers turned into spaces."""
    return re.sub(r"[^\s>]", " ", prefix)


def _closing_fence(text: str, token: "Token", lo: int, hi: int) -> Optional[str]:
    """None when the fence ``token`` (characters ``[lo, hi)`` of ``text``) ends with a closing
    fence line; else the line that would close it: its opener's indentation (and block-quote
    marks) and fence."""
    lines = text[lo:hi].split("\n")
    body = [line for line in lines[1:] if line.strip()]
    closer = _BARE_FENCE.match(body[-1]) if body else None
    if closer is not None and closer.group(1)[0] == token.markup[0] and len(closer.group(1)) >= len(token.markup):
        return None
    return _container_indent(lines[0][: lines[0].index(token.markup)]) + token.markup


def _code_regions(
    text: str, tokens: Sequence["Token"], offsets: list[int]
) -> tuple[list[tuple[int, int, str, bool]], list[tuple[int, int]]]:
    """Where a marker would be shown as code (or raw HTML): the code and HTML blocks of ``text``
    as ``(a, b, prefix, blank)`` (characters ``[a, b)``; ``prefix``: the indentation and
    block-quote marks a line after the block needs to stay in the block's container; ``blank``:
    whether that line needs a blank line before it, as after an HTML block, which runs to one)
    and its inline code spans as ``(a, b)`` (:func:`_code_spans`)."""
    blocks, spans = [], []
    for token in tokens:
        if token.map is None:
            continue
        if token.type in ("fence", "code_block", "html_block"):
            lo, hi = _chars(offsets, token.map)
            first = text[lo:hi].split("\n", 1)[0]
            if token.level == 0:  # at the top level a line needs nothing before it
                lead = ""
            elif token.type == "fence":
                lead = _container_indent(first[: first.index(token.markup)])
            elif token.type == "html_block":
                lead = _container_indent(first[: len(first) - len(first.lstrip(" \t>"))])
            else:  # an indented code block: its indentation less the four spaces that make it code
                lead = _container_indent(first[: len(first) - len(first.lstrip(" \t>"))])[:-4]
            blocks.append((lo, hi, lead, token.type == "html_block"))
        elif token.type == "inline":
            spans.extend(_code_spans(text, *_chars(offsets, token.map)))
    return blocks, spans


def _code_spans(text: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """The inline code spans of the block ``text[lo:hi]`` as ``(a, b)``, paired as CommonMark
    pairs backtick runs: an opening run (without a first backtick escaped by a backslash) takes
    the next run of the same length (backslashes are literal inside code); a run without a
    partner is literal text."""
    runs = [(lo + m.start(), lo + m.end()) for m in re.finditer("`+", text[lo:hi])]
    spans = []
    i = 0
    while i < len(runs):
        start, end = runs[i]
        start += (start - lo - len(text[lo:start].rstrip("\\"))) % 2  # an escaped first backtick
        partner = next((j for j in range(i + 1, len(runs)) if runs[j][1] - runs[j][0] == end - start), None)
        if start == end or partner is None:
            i += 1
            continue
        spans.append((start, runs[partner][1]))
        i = partner + 1
    return spans


def _marker_offset(text: str, where: int, code_spans: Sequence[tuple[int, int]]) -> int:
    """``where``, moved past the inline code span it is inside and past the backtick run it
    would split (two runs either side of a marker could pair into a code span around it); before
    a backslash that escapes what follows it (after it, the marker would take the escape)."""
    if (where - len(text[:where].rstrip("\\"))) % 2:
        where -= 1
    while True:
        inside = [hi for lo, hi in code_spans if lo < where < hi]
        if inside:
            where = inside[0]
        elif 0 < where < len(text) and text[where - 1] == "`" == text[where]:
            where += len(text[where:]) - len(text[where:].lstrip("`"))
        else:
            return where


def _close_open_fences(text: str, cited: list[tuple[int, int, str]]) -> tuple[str, list[tuple[int, int, str]]]:
    """``text`` with every fenced code block closed by a fence line, and ``cited`` moved along.

    A fence a cited span opens is closed after the line that span ends on, so
    what follows reads as Markdown again (were it code, it now reads as text:
    shown, not swallowed); another one where its block ends (the end of the
    text, or of the list item or quote holding it). ``cited``: ``(start, end,
    marker)`` of each cited span.
    """
    parser = _markdown_parser()
    tried: set[int] = set()
    # Each fence of the text needs one closing line; a closing line a container misreads as an
    # opener is not chased further than the text's own lines.
    for _ in range(text.count("\n") + 1):
        offsets = _line_offsets(text)
        tokens = [t for t in parser.parse(text) if t.type == "fence" and t.map is not None]
        unclosed = [(lo, hi, fence) for t in tokens for lo, hi in [_chars(offsets, t.map)] if (fence := _closing_fence(text, t, lo, hi))]
        pending = [entry for entry in unclosed if entry[0] not in tried]
        if not pending:
            return text, cited
        line, at, fence = pending[0]
        tried.add(line)  # a closing line that does not take (a container misread) is not retried
        opened = text.index(fence.lstrip(" \t>"), line)  # the opening fence itself
        for start, end, _marker in cited:
            if start <= opened < end:
                newline = text.find("\n", end - 1)
                at = min(at, len(text) if newline < 0 else newline + 1)
                break
        closing = ("" if at == 0 or text[at - 1] == "\n" else "\n") + fence + "\n"
        text = text[:at] + closing + text[at:]
        cited = [(a + len(closing) * (a >= at), b + len(closing) * (b >= at), m) for a, b, m in cited]
    return text, cited


def _emphasis_allowed(text: str, a: int, b: int, code: Iterable[tuple[int, int]]) -> bool:
    """Whether ``**`` around ``text[a:b]`` renders as bold and changes nothing else: one line of
    plain text (no backslash to escape a star) outside code, not opening a line (where it could be a list or heading marker), and
    with edges that CommonMark lets open and close emphasis."""
    piece = text[a:b]
    if not piece or any(ch in piece for ch in "\n`*_\\") or any(lo < b and a < hi for lo, hi in code):
        return False
    line_start = text.rfind("\n", 0, a) + 1
    if not text[line_start:a].strip() and not piece[0].isalnum():
        return False
    before, after = text[a - 1 : a], text[b : b + 1]
    return not (before.isalnum() and not piece[0].isalnum()) and not (after.isalnum() and not piece[-1].isalnum())


def place_markers(pieces: Sequence[tuple[str, Optional[str]]], emphasize: bool = False) -> str:
    """Join ``pieces`` (``(text, marker)``: the marker goes after the text; None for none) into
    Markdown whose markers a renderer shows.

    A marker never lands in code: one that would end inside inline code goes
    after the code span, one inside a code block on its own line after the
    block (indented like the block's fence). A fence a cited piece opens and
    nothing closes is closed after that piece's last line, so it cannot
    swallow the rest of the answer; a fence left open elsewhere is closed
    where its block ends (:func:`_close_open_fences`). With ``emphasize`` the
    marked pieces are also bold where that is safe (:func:`_emphasis_allowed`).
    Whitespace at a piece's end stays after its marker.
    """
    text, cited, at = "", [], 0
    for piece, marker in pieces:
        text += piece
        if marker is not None:
            cited.append((at, at + len(piece), marker))
        at += len(piece)
    text, cited = _close_open_fences(text, cited)
    return _insert(text, _insertions(text, cited, emphasize))


def _insertions(text: str, cited: list[tuple[int, int, str]], emphasize: bool) -> dict[int, list[tuple[str, Any]]]:
    """Where each cited span's marker (and bold) goes in ``text``: ``offset -> [(kind, value)]``,
    kind ``"close"`` / ``"open"`` (``**``), ``"inline"`` (a marker) or ``"line"`` (``(marker,
    indentation, blank line before)``: a marker on its own line after a block)."""
    blocks, code_spans = _code_regions(text, _markdown_parser().parse(text), _line_offsets(text))
    code = [*((lo, hi) for lo, hi, _, _ in blocks), *code_spans]
    inserts: dict[int, list[tuple[str, Any]]] = {}
    for start, end, marker in cited:
        core_end = start + len(text[start:end].rstrip())
        core_start = core_end - len(text[start:core_end].strip())
        if core_start == core_end:  # copied whitespace: nothing to mark
            continue
        if emphasize and _emphasis_allowed(text, core_start, core_end, code):
            inserts.setdefault(core_start, []).append(("open", "**"))
            inserts.setdefault(core_end, []).append(("close", "**"))
        where = _marker_offset(text, core_end, code_spans)
        entry: tuple[str, Any] = ("inline", marker)
        for lo, hi, prefix, blank in blocks:
            if lo < where <= hi:  # in the block, or right after its last character (a fence line ending the text)
                where, entry = hi, ("line", (marker, prefix, blank))
        inserts.setdefault(where, []).append(entry)
    return inserts


def _insert(text: str, inserts: dict[int, list[tuple[str, Any]]]) -> str:
    """``text`` with the :func:`_insertions` made; at one offset: closing ``**``, inline markers,
    the marker line, opening ``**``. A marker repeated at one offset is written once."""
    out, last = [], 0
    for where in sorted(inserts):
        out.append(text[last:where])
        kinds = {kind: [value for k, value in inserts[where] if k == kind] for kind in ("close", "inline", "line", "open")}
        out.extend(kinds["close"] + _unique(kinds["inline"]))
        if kinds["line"]:
            _, prefix, blank = kinds["line"][0]
            ending = len(text[:where]) - len(text[:where].rstrip("\n"))  # newlines already before it
            before = "" if where == 0 else "\n" * max((2 if blank else 1) - ending, 0)
            # A marker line at the top level stands apart; one in a list item or quote keeps it going.
            apart = not prefix and not text.startswith("\n", where)
            after = "" if where == len(text) else "\n\n" if apart else "\n"
            out.append(before + prefix + "".join(_unique([marker for marker, _, _ in kinds["line"]])) + after)
        out.extend(kinds["open"])
        last = where
    out.append(text[last:])
    return "".join(out)


def _unique(items: list[str]) -> list[str]:
    """``items`` without repeats of the item just before (``[1][1]`` reads as ``[1]``)."""
    return [item for i, item in enumerate(items) if i == 0 or items[i - 1] != item]


# --------------------------------------------------------------------------- renderers
def marked_spans(output: NestOutput, marker: Callable[[int], str], model_marker: str = MODEL_MARK) -> list[tuple[str, Optional[str]]]:
    """``(span text, marker)`` per span, for :func:`place_markers`: a copied span gets
    ``marker(n)``, ``n`` the number of its document (:class:`DocumentNumbers`); text the LM
    wrote (:func:`model_written`) gets ``model_marker``."""
    numbers = DocumentNumbers()
    marked: list[tuple[str, Optional[str]]] = []
    for span in output.spans:
        if span.copied and span.source is not None:
            marked.append((span.text, marker(numbers.number(span.source.location))))
        else:
            marked.append((span.text, model_marker if model_written(output, span) else None))
    return marked


def _markdown_text(text: str) -> str:
    """``text`` with the characters Markdown or HTML would read as markup backslash-escaped."""
    return re.sub(r"([\\`*_\[\]<>#|!&])", r"\\\1", text)


def _markdown_code(text: str) -> str:
    """``text`` as Markdown inline code (fenced with more backticks than it holds)."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render_markdown(output: NestOutput) -> str:
    """Markdown: copied spans in bold (where that is safe) followed by ``[n]``, text the LM wrote
    followed by :data:`MODEL_MARK`, then the sources.

    ``[n]`` numbers the cited documents in order of first use
    (:func:`cited_documents`); the markers are escaped brackets, so no renderer
    takes them for links or footnotes, and :func:`place_markers` keeps them out
    of code. The sources follow as a list: ``[n]`` the document, then each cited
    range's lines and characters.
    """
    body = place_markers(marked_spans(output, lambda n: f"\\[{n}\\]", _markdown_text(MODEL_MARK)), emphasize=True)
    documents = cited_documents(output.spans)
    note = model_note(output)
    if not documents and note is None:
        return body
    items = []
    for doc in documents:
        name = _markdown_code(doc.document) + (f" ({_markdown_text(doc.extra_title)})" if doc.extra_title else "")
        items.append(f"- \\[{doc.number}\\] {name}: {doc.ranges()}")
    if note is not None:
        items.append(f"- {_markdown_text(note)}")
    return body.rstrip() + "\n\nSources:\n\n" + "\n".join(items) + "\n"


def render_html(output: NestOutput) -> str:
    """HTML: copied spans highlighted with a hover title naming the document and its lines,
    numbered superscripts, text the LM wrote in grey italics marked :data:`MODEL_MARK`, then the
    numbered sources."""
    numbers = DocumentNumbers()
    parts = ['<div class="nest-output" style="line-height:1.6">']
    for span in output.spans:
        text = html.escape(span.text)
        if span.copied and span.source is not None:
            location = span.source.location
            n = numbers.number(location)
            title = html.escape(f"[{n}] {location.document}: {location.describe()}")
            parts.append(f'<mark style="background:#cfe8ff" title="{title}">{text}</mark><sup>[{n}]</sup>')
        elif model_written(output, span):
            parts.append(
                f'<span class="nest-model" style="color:#666;font-style:italic" title="{html.escape(MODEL_NOTE)}">{text}</span>'
                f"<sup>{MODEL_MARK}</sup>"
            )
        else:
            parts.append(text)
    parts.append("</div>")
    documents = cited_documents(output.spans)
    if documents:
        parts.append("<ol>" + "".join(f"<li>{html.escape(doc.describe())}</li>" for doc in documents) + "</ol>")
    if (note := model_note(output)) is not None:
        parts.append(f'<p class="nest-model-note" style="color:#666">{html.escape(note)}</p>')
    return "".join(parts)


def render_terminal(output: NestOutput) -> Any:
    """A rich renderable: copied spans highlighted with ``[n]`` after them, text the LM wrote in
    italics with :data:`MODEL_MARK` after it, then the numbered sources."""
    from rich.console import Group
    from rich.text import Text

    numbers = DocumentNumbers()
    body = Text()
    for span in output.spans:
        written = model_written(output, span)
        body.append(span.text, style="bold cyan" if span.copied else "italic" if written else None)
        if span.copied and span.source is not None:
            body.append(f"[{numbers.number(span.source.location)}]", style="dim cyan")
        elif written:
            body.append(MODEL_MARK, style="dim yellow")
    listing = source_listing(output) + [note for note in [model_note(output)] if note is not None]
    return Group(body, Text("\n".join(listing), style="dim")) if listing else body
