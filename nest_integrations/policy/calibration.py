"""Fitting the RRC offset alpha and temperature tau to a model and a corpus.

The mixture weight of the LM is ``lambda = sigmoid((d_min/d_max - alpha) / tau)``
(:func:`~nest_integrations.core.mixture.rrc_lambda`). The distance ratio's scale
depends on the model, its key layer and the corpus (the same LM's ratios sit
lower over Markdown documentation than over encyclopedia prose), so alpha and
tau follow them instead of being one fixed pair.

Procedure (:func:`calibrate`, ``nest calibrate``), on the user's own passages,
no questions needed: for ``n`` passages of the corpus, cut each at a sentence
boundary (anywhere in the passage), give the text before the cut as a plain
prompt and teacher-force the text after it, recording the distance ratio at
every forced token twice:

* *known*: the passage itself is in the token datastore (with the passages
  the first stage retrieves beside it), so the corpus holds the next token;
* *unknown*: the passage is excluded, so it does not.

The two ratio distributions are then mapped onto the reference scale the
defaults were chosen on (:func:`fit_alpha_tau`): alpha is the ratio below
which the same share of *unknown* steps fall as below the default alpha on the
default model, and tau is the same multiple of their interquartile range. So the
default model keeps its behaviour and another model's mixture trusts retrieval
as often as the default's does, at its own scale. The best separating
threshold and its balanced accuracy are reported beside them: they say how
well this model's keys tell known from unknown at all.

Results are keyed by the model fingerprint and saved with an index
(:class:`CalibrationFile`), so a calibration runs once per model and corpus.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Annotated

from nest_integrations.core.config import DEFAULT_ALPHA, DEFAULT_TAU, NestConfig
from nest_integrations.core.safe_io import validation_message, write_file_atomic
from nest_integrations.corpus.chunking import sentence_spans
from nest_integrations.corpus.passages import Passage

logger = logging.getLogger(__name__)

CALIBRATION_FILE = "calibration.json"
"""File name of the calibrations saved in an index folder."""

REFERENCE_UNKNOWN_SHARE = 0.88
"""Share of *unknown* steps whose ratio falls below alpha. The default LM on its reference
corpus (SmolLM2-135M-Instruct, 600 Wikipedia summaries of people, 24 passages, 706 forced
tokens per condition) has 0.88 of its unknown ratios below the paper's alpha 0.3, the value
its defaults were measured with: with the relevance gate deciding whether to copy at all,
the mixture trusts retrieval at nearly every step it is allowed to (docs: Calibration)."""

REFERENCE_TAU_SPREAD = 1.0
"""tau as a multiple of the *unknown* ratios' interquartile range: the paper's tau 0.1 over
the same reference's range (0.109 to 0.207)."""

PROMPT_TOKENS = 64
"""Tokens of the text before the cut kept as the prompt."""

FORCED_TOKENS = 32
"""Tokens after the cut teacher-forced per passage."""

DATASTORE_PASSAGES = 4
"""Passages in the token datastore per forced text: the passage and the 3 the first stage
retrieves beside it (*known*), or the 4 it retrieves without it (*unknown*). The relevance
gate keeps 1 to 4 passages for most questions, and each one costs its key encoding."""

MIN_PASSAGES = 4
"""Passages measured before a time budget may end a calibration."""

MIN_TAU = 1e-3
"""The smallest tau a fit gives: below it lambda is a step function of the ratio (a saved tau
below it, 1e-300 say, makes every step all LM or all retrieval)."""

Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
"""A distance ratio ``d_min/d_max``, or a threshold on it, or a share: in [0, 1]."""


class CalibrationCorpus(Protocol):
    """What calibration needs of an index or a store: its LM, its passages, a first stage
    that can leave a passage out, and a decoder (a :class:`~nest_integrations.index.nest_index.NestIndex`)."""

    lm: Any
    passages: Sequence[Passage]

    def retrieve(self, query: str, k: int, *, exclude_ids: Sequence[str] = ()) -> list[tuple[Passage, float]]: ...

    def decoder(self, config: Optional[NestConfig] = None) -> Any: ...


def retrieve_excluding(
    search: Callable[[str, int], list[tuple[Passage, float]]], query: str, k: int, exclude_ids: Sequence[str] = ()
) -> list[tuple[Passage, float]]:
    """Top-k of ``search(query, ...)`` without the passages in ``exclude_ids``: asks for that
    many more, so leaving the source out (calibration's *unknown* steps, source-absent
    evaluation) still gives ``k`` passages."""
    excluded = set(exclude_ids)
    hits = search(query, k + len(excluded))
    return [(p, s) for p, s in hits if p.id not in excluded][:k]


class Calibration(BaseModel):
    """alpha and tau fitted for one LM on one corpus, with the evidence behind them.

    Every number is finite and within what a fit can give (a ratio in [0, 1], tau in
    [:data:`MIN_TAU`, 1]): a saved file holding NaN, an infinity or 1e-300 is refused
    (:meth:`CalibrationFile.parse` fits that LM again).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lm_name: str = Field(description="Name the LM was loaded under.")
    lm_fingerprint: str = Field(description="The LM's weights digest (lm.model_fingerprint): the key it is saved under.")
    alpha: Ratio = Field(description="Calibrated RRC offset on this model's ratio scale (a quantile of its ratios).")
    tau: float = Field(ge=MIN_TAU, le=1.0, description="Calibrated RRC temperature on this model's ratio scale (a spread of its ratios).")
    separating_alpha: Ratio = Field(description="The ratio threshold that best separates known from unknown steps.")
    balanced_accuracy: Ratio = Field(description="Balanced accuracy of that threshold: 0.5 is chance, 1.0 perfect.")
    known_ratio_quantiles: dict[str, Ratio] = Field(description="Quantiles 0.1..0.9 of the ratio where the corpus holds the next token.")
    unknown_ratio_quantiles: dict[str, Ratio] = Field(description="The same where it does not.")
    passages: int = Field(ge=0, description="Passages teacher-forced.")
    tokens: int = Field(ge=0, description="Forced tokens per condition.")
    seconds: float = Field(ge=0, description="Wall time of the calibration.")


class CalibrationFile(BaseModel):
    """The calibrations saved in an index folder, one per LM fingerprint."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field("nest-calibration", pattern="^nest-calibration$")
    version: int = Field(1, ge=1, le=1)
    calibrations: dict[str, Calibration] = Field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Optional[bytes], where: str) -> "CalibrationFile":
        """The calibrations in a file's bytes (None: no file). A calibration is a cache: what is
        not valid is fitted again, never trusted, with a warning naming ``where``: the whole file
        when it is not a calibration file, else each entry that is not a valid
        :class:`Calibration` (a value not finite or out of bounds) or that stands under
        another LM's fingerprint."""
        if raw is None:
            return cls()
        try:
            data = json.loads(raw)
            entries = data.get("calibrations", {}) if isinstance(data, dict) else None
            if not isinstance(entries, dict):
                raise ValueError("not a JSON object with a 'calibrations' object")
            file = cls.model_validate({**data, "calibrations": {}})
        except (ValueError, RecursionError) as err:  # a pydantic ValidationError is a ValueError
            logger.warning("ignoring unreadable %s (%s); the model will be calibrated again", where, err)
            return cls()
        for key, entry in entries.items():
            try:
                calibration = Calibration.model_validate(entry)
            except ValidationError as err:
                logger.warning("ignoring the calibration %s in %s (%s); the model will be calibrated again", key, where, validation_message(err))
                continue
            if calibration.lm_fingerprint != key:
                logger.warning("ignoring the calibration %s in %s: it is %s's; the model will be calibrated again", key, where, calibration.lm_fingerprint)
                continue
            file.calibrations[key] = calibration
        return file

    def to_bytes(self) -> bytes:
        """The file's bytes (indented JSON)."""
        return self.model_dump_json(indent=1).encode()

    def write(self, folder: Path) -> None:
        """Write the file into the new folder of a save (an existing file is replaced atomically)."""
        write_file_atomic(Path(folder) / CALIBRATION_FILE, self.to_bytes())


def best_threshold(known: np.ndarray, unknown: np.ndarray) -> tuple[float, float]:
    """Threshold t maximising balanced accuracy of ``ratio < t`` as "known".

    Args:
        known, unknown: float (n,) ratios. Returns (t, balanced accuracy).
    """
    candidates = np.unique(np.concatenate([known, unknown]))
    if len(candidates) == 0:
        raise ValueError("no ratios to calibrate on")
    best_t, best_acc = float(candidates[0]), -1.0
    for t in np.quantile(candidates, np.linspace(0, 1, 201)):
        acc = 0.5 * (np.mean(known < t) + np.mean(unknown >= t))
        if acc > best_acc:
            best_t, best_acc = float(t), float(acc)
    return best_t, best_acc


def _quantiles(values: np.ndarray) -> dict[str, float]:
    return {str(q): round(float(np.quantile(values, q)), 4) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}


def fit_alpha_tau(known: np.ndarray, unknown: np.ndarray) -> dict[str, Any]:
    """alpha and tau on the reference scale, the separating threshold, and both distributions.

    alpha is the ``REFERENCE_UNKNOWN_SHARE`` quantile of the unknown ratios; tau is
    ``REFERENCE_TAU_SPREAD`` times their interquartile range (at least :data:`MIN_TAU`).
    Quantiles, not raw values, carry over between models: a model whose
    ratios all sit near 1 (every key about as far as the others) gets an alpha
    near 1 instead of an LM weight of 1 everywhere.

    Args:
        known, unknown: float (n,) distance ratios in [0, 1].
    """
    if len(known) == 0 or len(unknown) == 0:
        raise ValueError("no ratios to calibrate on")
    separating, accuracy = best_threshold(known, unknown)
    iqr = float(np.quantile(unknown, 0.75) - np.quantile(unknown, 0.25))
    return {
        "alpha": round(float(np.quantile(unknown, REFERENCE_UNKNOWN_SHARE)), 4),
        "tau": round(max(REFERENCE_TAU_SPREAD * iqr, MIN_TAU), 4),
        "separating_alpha": round(separating, 4),
        "balanced_accuracy": round(accuracy, 4),
        "known_ratio_quantiles": _quantiles(known),
        "unknown_ratio_quantiles": _quantiles(unknown),
    }


def continuation_cuts(
    passages: Sequence[Passage], n: int, *, seed: int = 0, min_chars: int = 120
) -> list[tuple[Passage, int]]:
    """``n`` (passage, cut) pairs: a passage of at least two sentences and a sentence start inside it.

    The cut is drawn among the passage's sentence starts after the first, so the
    forced text is any sentence of a passage, not only its second one. Passages
    are drawn without replacement; fewer than ``n`` come back when the corpus has
    fewer usable passages.
    """
    rng = random.Random(seed)
    order = list(range(len(passages)))
    rng.shuffle(order)
    cuts: list[tuple[Passage, int]] = []
    for i in order:
        if len(cuts) >= n:
            break
        passage = passages[i]
        if len(passage.text) < min_chars:
            continue
        starts = [start for start, _ in sentence_spans(passage.text)[1:] if len(passage.text) - start >= 20]
        if starts:
            cuts.append((passage, rng.choice(starts)))
    return cuts


def measure_ratios(
    index: CalibrationCorpus, cuts: Sequence[tuple[Passage, int]], *, on_item: Optional[Callable[[], bool]] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Distance ratios (known, unknown), float (tokens,) each, over the forced text of the cuts.

    ``on_item`` is called after each cut; returning False stops the measurement there.

    The prompt is the last ``PROMPT_TOKENS`` tokens before the cut, as plain
    text (no chat template, so base and chat models are measured alike); the
    first-stage query is the passage title and that prompt.
    """
    # The ratios do not depend on alpha/tau; fixing them keeps the decoder from asking for a calibration.
    decoder = index.decoder(NestConfig(alpha=DEFAULT_ALPHA, tau=DEFAULT_TAU))
    tokenizer = index.lm.tokenizer
    k = DATASTORE_PASSAGES
    known: list[float] = []
    unknown: list[float] = []
    for passage, cut in cuts:
        before = tokenizer(passage.text[:cut], add_special_tokens=False)["input_ids"][-PROMPT_TOKENS:]
        after = tokenizer(passage.text[cut:], add_special_tokens=False)["input_ids"][:FORCED_TOKENS]
        prompt, forced = tokenizer.decode(before).strip(), tokenizer.decode(after)
        query = f"{passage.title}: {prompt}" if passage.title else prompt
        others = index.retrieve(query, k, exclude_ids=(passage.id,))
        for hits, sink in (([(passage, 1.0), *others[: k - 1]], known), (others, unknown)):
            if not hits:
                continue
            scored = decoder.score(
                prompt, forced, query=query, passages=hits, mode="nest", min_passage_relevance=-1.0, use_chat_template=False
            )
            sink.extend(scored.ratio.tolist())
        if on_item is not None and not on_item():
            break
    return np.asarray(known, dtype=np.float64), np.asarray(unknown, dtype=np.float64)


def calibrate(
    index: CalibrationCorpus, *, n: int = 12, seed: int = 0, budget_s: Optional[float] = 90.0, show_progress: bool = True
) -> Calibration:
    """Fit alpha/tau for ``index.lm`` on up to ``n`` passages of the index's own corpus.

    Cost: per passage, one short teacher-forced forward per condition and the
    key encoding of up to ``DATASTORE_PASSAGES + 1`` passages (none when keys
    are precomputed). ``budget_s`` bounds the wall time: after it, the
    calibration ends with the passages measured so far (at least
    ``MIN_PASSAGES``); None measures all ``n``. More passages give steadier
    quantiles for the time; ``Calibration.passages`` says how many were used.

    Raises:
        ValueError: the corpus has no passage of two sentences to cut.
    """
    from tqdm.auto import tqdm

    cuts = continuation_cuts(index.passages, n, seed=seed)
    if not cuts:
        raise ValueError("calibration needs passages of at least two sentences; the corpus has none")
    t0 = time.perf_counter()
    done = 0
    desc = f"Calibrating {index.lm.name} on up to {len(cuts)} passages" + (f" (at most {budget_s:.0f} s)" if budget_s else "")
    with tqdm(total=len(cuts), desc=desc, unit="passage", disable=not show_progress) as bar:

        def measured() -> bool:
            nonlocal done
            done += 1
            bar.update(1)
            return budget_s is None or done < MIN_PASSAGES or time.perf_counter() - t0 < budget_s

        known, unknown = measure_ratios(index, cuts, on_item=measured)
    fitted = fit_alpha_tau(known, unknown)
    result = Calibration(
        lm_name=index.lm.name, lm_fingerprint=index.lm.fingerprint(), passages=done,
        tokens=int(min(len(known), len(unknown))), seconds=round(time.perf_counter() - t0, 2), **fitted,
    )
    logger.info("calibrated %s on %d passages: alpha %.4f tau %.4f (balanced accuracy %.2f)", result.lm_name, done, result.alpha, result.tau, result.balanced_accuracy)
    return result
