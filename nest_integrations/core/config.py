"""NestConfig: every decoding hyperparameter, validated and documented.

Defaults are tuned for the embedded SmolLM2-135M-Instruct over the Wikipedia
summaries (see docs/calibration.md and ``nest calibrate``); the
paper's values (Llama-2-Chat 7B on Wikipedia) are noted beside each.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Mode = Literal["base", "rag", "knnlm", "nest", "ra_nest"]

DEFAULT_ALPHA = 0.3
"""RRC offset used without a calibration (the paper's value; the default LM's calibrated
value on the Wikipedia summaries is close to it, see nest_integrations.policy.calibration)."""

DEFAULT_TAU = 0.1
"""RRC temperature used without a calibration (the paper's value)."""

MODES: tuple[str, ...] = ("base", "rag", "knnlm", "nest", "ra_nest")


class NestConfig(BaseModel):
    """Hyperparameters of one NEST generation.

    Modes (docs/index.md, Modes): ``base`` the LM alone; ``rag`` the top
    ``rag_passages`` passages in the prompt, then ``base``; ``knnlm`` the
    two-stage kNN-LM with a fixed ``knnlm_lambda``, one token per step; ``nest``
    RRC mixture, span selection and relaxed speculative decoding; ``ra_nest``
    ``nest`` with the top passages also in the prompt (and ``ra_gamma``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mode: Mode = Field("nest", description="Decoding mode: base, rag, knnlm, nest or ra_nest.")
    # --- retrieval -------------------------------------------------------
    passage_k: int = Field(
        8, ge=1, le=1000,
        description="Passages retrieved in the first stage whose tokens form the datastore searched "
        "while decoding (paper: 40). Each is encoded by the LM unless keys are precomputed, so on CPU "
        "this is the main cost knob.",
    )
    rag_passages: int = Field(3, ge=1, description="Passages put in the prompt in rag / ra_nest modes (paper: 3).")
    token_k: int = Field(1024, ge=1, description="Neighbours r kept per kNN search (paper: 1024).")
    min_passage_relevance: float = Field(
        0.3, ge=-1.0, le=1.0,
        description="Relevance gate (beyond the paper, see nest_integrations.policy.relevance): the dense cosine similarity "
        "to the retrieval query a passage needs to enter the token datastore, so NEST falls back to the LM when the "
        "corpus does not cover the prompt. -1 disables the gate.",
    )
    relevance_margin: float = Field(
        0.2, ge=0.0,
        description="Relevance gate: a passage also needs a cosine within this of the best retrieved passage's.",
    )
    min_query_coverage: float = Field(
        0.25, ge=0.0, le=1.0,
        description="Relevance gate: share of the query's content words the passage text must contain (a query "
        "that is a bare name instead needs the passage to open with that name). Higher turns away more questions "
        "the documents do not answer, and more that users ask in their own words (the trade-off measured in "
        "docs/method.md: Knowing when not to copy).",
    )
    fallback: Literal["abstain", "lm"] = Field(
        "abstain",
        description="What nest and ra_nest answer to a chat prompt when no retrieved passage answers it (the "
        "first stage returned nothing, or the relevance gate kept nothing): 'abstain' says plainly that the "
        "documents do not cover the question and names the nearest retrieved sections (finish_reason "
        "'not_covered'); 'lm' lets the LM answer alone, and every renderer marks that text as written by the "
        "model. A small LM answering alone invents; text completion (a plain prompt) always continues with the LM.",
    )
    # --- mixture ---------------------------------------------------------
    alpha: Optional[float] = Field(
        None,
        allow_inf_nan=False,
        description="RRC offset: lambda = sigmoid((d_min/d_max - alpha) / tau) (paper: 0.3). None: the value "
        "calibrated for this LM on the index's or store's own corpus (nest_integrations.policy.calibration, `nest "
        "calibrate`; run automatically the first time they meet an LM), else DEFAULT_ALPHA. The ratio's scale "
        "differs between models: a fixed value that makes one model copy leaves another writing alone.",
    )
    tau: Optional[float] = Field(
        None, gt=0, allow_inf_nan=False,
        description="RRC temperature (paper: 0.1). None: calibrated with alpha, else DEFAULT_TAU.",
    )
    knn_temperature: float = Field(
        0.1, gt=0,
        description="Temperature of p_kNN over distances relative to the nearest neighbour; the paper's "
        "softmax(s/sqrt(d)) is a one-hot spike at this model's distance scale.",
    )
    knnlm_lambda: float = Field(0.7, ge=0.0, le=1.0, description="Fixed LM weight in knnlm mode (paper: 0.7).")
    # --- spans -----------------------------------------------------------
    delta: float = Field(0.5, ge=0.0, le=1.0, description="Propose a span when lambda <= delta (paper: 0.5).")
    span_length: int = Field(64, ge=1, le=512, description="Span proposal length n in tokens (paper: 64).")
    gamma: float = Field(5e-4, gt=0, le=1.0, allow_inf_nan=False, description="Relaxed acceptance leniency; smaller accepts more (paper: 5e-4 for 7B).")
    ra_gamma: float = Field(0.5, gt=0, le=1.0, description="gamma in ra_nest mode, passages also in the prompt (paper: 0.5).")
    stop_at_source_end: bool = Field(
        True,
        description="End the generation when copying reaches the last token of its source passage and no "
        "retrieved passage continues it (a later chunk of the same document). Beyond the paper, which goes on "
        "with the LM: after a fully copied source the LM writes alone, and a small LM mostly invents (docs/method.md: "
        "Knowing when to stop). Applies to nest and ra_nest.",
    )
    seams: bool = Field(
        True,
        description="Start a copy only where a reader accepts it: at a sentence start of the source when the text so "
        "far ends a sentence, else where the source continues the text so far (nest_integrations.policy.copy_policy).",
    )
    answer_focus: bool = Field(
        True,
        description="For a question, copy the windows of the kept passages that best answer it (a sentence, or in "
        "Markdown the blocks it touches; answer_windows of them) and end the answer when the last is copied "
        "(finish_reason 'answered'), instead of copying a passage to its end. Applies to chat prompts in nest and ra_nest.",
    )
    answer_windows: int = Field(
        3,
        ge=1,
        description="With answer_focus, how many answer windows an answer copies, best first, each after the one "
        "before it is copied; max_new_tokens cuts the last one it reaches. More windows hold the answer more often "
        "(the best-scored window is a neighbour of the answer in a third to a half of the misses) in a longer answer.",
    )
    fill_windows: int = Field(
        1,
        ge=0,
        description="With answer_focus, how many more windows (the next best after the answer_windows ones) an "
        "answer copies when each fits whole in what is left of max_new_tokens and closes the answer: a lower-ranked "
        "window holds the answer less often, and cut by the budget it would end the answer mid-sentence. 0: none.",
    )
    check_answer_windows: bool = Field(
        False,
        description="With answer_focus, let the relaxed check cut a planned answer window short where the mixture "
        "disagrees with its next token. Off: a planned window (chosen by the answer selector for this question) is "
        "copied whole, and the LM writes nothing inside it. On, the paper's check: a window cut mid-sentence leaves "
        "the LM to write on, and a small LM writing there mostly invents (docs/method.md: Choosing what to copy).",
    )
    accept_threshold: float = Field(0.5, gt=0.0, lt=1.0, description="Deterministic acceptance when the ratio exceeds this.")
    repeat_ngram: int = Field(
        8,
        ge=0,
        description="Repetition guard for copies (nest and ra_nest): a copy stops before a token that would complete a "
        "run of this many tokens the answer already holds; 0 turns it off. Smaller catches shorter loops but also cuts "
        "copies of sources that repeat a phrase ('of the United States' twice) (nest_integrations.policy.repetition).",
    )
    lm_repeat_ngram: int = Field(
        4,
        ge=0,
        description="Repetition guard for the tokens nest and ra_nest pick from p_M (the LM writing between or "
        "without copies): none may complete a run of this many tokens the answer already holds (transformers' "
        "no_repeat_ngram_size); 0 turns it off. A small LM writing alone otherwise repeats its sentences.",
    )
    # --- generation ------------------------------------------------------
    max_new_tokens: int = Field(
        256, ge=0,
        description="Tokens to generate at most. A question's answer usually ends before, with its last answer "
        "window (finish_reason 'answered'); this bounds everything else, and cuts an answer whose windows are long "
        "(documentation's code examples), so lower it for shorter answers.",
    )
    stop: list[str] = Field(
        default_factory=list, description="Stop strings (non-empty); the text ends before the first one."
    )
    do_sample: bool = Field(False, description="Sample from p_M instead of taking its argmax.")
    temperature: float = Field(
        1.0, ge=0, allow_inf_nan=False, description="Sampling temperature on p_M (do_sample only); 0 means greedy (the argmax)."
    )
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling mass (do_sample only).")
    seed: Optional[int] = Field(
        None, ge=0, le=2**64 - 1,
        description="Seed of the sampler (0 to 2**64 - 1, what torch.Generator.manual_seed takes); None draws from "
        "torch's global state.",
    )
    use_chat_template: bool = Field(True, description="Wrap prompts in the model's chat template when it has one.")
    system_prompt: Optional[str] = Field(
        "",
        description="System message for the chat template; None keeps the template's default. The default is an "
        "empty system turn: SmolLM2's built-in one ('You are a helpful AI assistant named SmolLM...') makes the LM, "
        "writing alone, garble the subject's name more often (measured in docs/method.md, System turn).",
    )
    max_prompt_tokens: Optional[int] = Field(
        None, ge=1,
        description="Longer prompts keep their last tokens (documented truncation); None: the model's context "
        "length minus max_new_tokens.",
    )

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, stop: list[str]) -> list[str]:
        if any(s == "" for s in stop):
            raise ValueError("stop strings must be non-empty (an empty one would end every generation at once)")
        return stop

    @model_validator(mode="after")
    def _check(self) -> "NestConfig":
        if self.rag_passages > self.passage_k and self.mode in ("ra_nest",):
            raise ValueError("rag_passages cannot exceed passage_k in ra_nest mode")
        return self

    @property
    def uses_datastore(self) -> bool:
        return self.mode in ("knnlm", "nest", "ra_nest")

    @property
    def uses_prompt_passages(self) -> bool:
        return self.mode in ("rag", "ra_nest")

    @property
    def effective_gamma(self) -> float:
        return self.ra_gamma if self.mode == "ra_nest" else self.gamma

    def updated(self, **overrides: object) -> "NestConfig":
        """A validated copy with ``overrides`` applied (unknown names raise)."""
        return NestConfig.model_validate({**self.model_dump(), **overrides})


def fold_config_fields(values: Any, field: str, *, skip: tuple[str, ...] = ()) -> Any:
    """Move :class:`NestConfig` knobs given as constructor keywords into ``values[field]``.

    Lets integration classes accept ``NestLLM(mode="base", gamma=1e-3)`` while
    keeping one validated ``NestConfig``. ``skip`` lists names the host class
    owns itself (e.g. LlamaIndex's ``system_prompt``). Use in a pydantic
    ``model_validator(mode="before")``.
    """
    if not isinstance(values, dict):
        return values
    knobs = {name: values[name] for name in NestConfig.model_fields if name in values and name not in skip}
    if not knobs:
        return values
    rest = {key: value for key, value in values.items() if key not in knobs}
    base = rest.get(field) or NestConfig()
    base = base if isinstance(base, NestConfig) else NestConfig.model_validate(base)
    rest[field] = base.updated(**knobs)
    return rest
