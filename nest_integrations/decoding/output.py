"""The output contract: what every generation returns (docs/api/output.md).

:class:`NestOutput` holds the text and :class:`Span` s that tile it exactly; a
copied span's text is verbatim its source passage (chunk) text between
``source.chunk_char_start`` and ``source.chunk_char_end``, and ``stats``
(:class:`GenerationStats`) says what the generation cost and why it ended.

Every copied span also says where it sits in its *document*
(:class:`SourceLocation`, ``span.source.location``): the file or document
name, the character range in the document and the line range, so a reader can
open the file at the cited lines. :func:`~nest_integrations.decoding.locations.locate`
fills it in; :mod:`~nest_integrations.decoding.spans` builds the spans and
:mod:`~nest_integrations.decoding.rendering` shows them.

Offsets in the chunk are named ``chunk_char_start`` / ``chunk_char_end``; an
output saved by 0.1, whose span sources hold them as ``char_start`` / ``char_end``,
still loads (:data:`KEYS_SAVED_BY_0_1`).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, Field, model_validator


class SourceRef(BaseModel):
    """A passage a generation drew on."""

    id: str = Field(description="The passage's id (Passage.id: a chunk's or node's id in the integrations).")
    title: str = Field("", description="The passage's title ('' when it has none).")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="The passage's metadata, as its loader, splitter or store gave it."
    )


DOCUMENT_FIELDS: tuple[str, ...] = ("source", "file_path", "path", "file_name", "doc_id")
"""Metadata fields naming a passage's document, in order of preference: LangChain loaders write
``source``, LlamaIndex readers ``file_path`` and ``file_name``, ``nest index build`` ``path``."""


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


KEYS_SAVED_BY_0_1: dict[str, str] = {"char_start": "chunk_char_start", "char_end": "chunk_char_end"}
"""The keys under which outputs saved by 0.1 hold a span source's chunk offsets, to their names
now (the old names read as document offsets, which they are not). A span source is only read
from them, never written with them; 0.1 wrote both, with the same values."""


class SpanSource(SourceRef):
    """Where a copied span sits: in its chunk (character offsets into ``Passage.text``) and in its document.

    ``chunk_char_start`` / ``chunk_char_end`` index the chunk's own text; where
    the span sits in its file is ``location`` (``location.char_start``,
    ``location.line_start``, ...). An output saved by 0.1 loads from the keys
    ``char_start`` / ``char_end`` (:data:`KEYS_SAVED_BY_0_1`).
    """

    chunk_char_start: int = Field(
        ge=0,
        description="Start of the span in its chunk's text (Passage.text), 0-based: not a document offset "
        "(that is location.char_start). Outputs saved by 0.1 hold it as char_start.",
    )
    chunk_char_end: int = Field(
        ge=0, description="End of the span (exclusive) in its chunk's text. Outputs saved by 0.1 hold it as char_end."
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

    @model_validator(mode="before")
    @classmethod
    def _saved_by_0_1(cls, data: Any) -> Any:
        """Outputs saved by 0.1: their chunk offsets under :data:`KEYS_SAVED_BY_0_1`'s old keys
        (alone, or next to the new ones with the same values, as 0.1 wrote them) move to the new
        fields; an old key that disagrees with its new one is refused, naming both."""
        if not isinstance(data, dict) or not data.keys() & KEYS_SAVED_BY_0_1.keys():
            return data
        data = dict(data)
        for old, new in KEYS_SAVED_BY_0_1.items():
            if old not in data:
                continue
            value = data.pop(old)
            if new not in data:
                data[new] = value
            elif data[new] != value:
                raise ValueError(f"span source {data.get('id', '')!r}: {old}={value!r} (saved by 0.1) disagrees with {new}={data[new]!r}")
        return data


def chunk_offsets(source: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(chunk_char_start, chunk_char_end)`` of a span source in an output's JSON
    (``NestOutput.to_dict()``), from :data:`KEYS_SAVED_BY_0_1`'s old keys for outputs saved by 0.1.
    The values are returned as found (not checked)."""
    start, end = (source.get(new, source.get(old)) for old, new in KEYS_SAVED_BY_0_1.items())
    return start, end


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
        description="Why the generation ended: the LM's end-of-sequence token, a stop string, max_new_tokens ('length'; "
        "a copy in code stops at the last line end before it and closes its block, so it may end a few tokens short), "
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
